"""Composed Hydra config -> Molt `train_rl_ray` flags.

`render_command(cfg, run_dir, actions, agent_file, resume, model_copy)` returns a `MoltCommand`: the ordered flags, the
environment the Molt process needs, and a shell-quoted command line that reruns it. Flags come
from the structured nodes (`algo`, `placement`, `model`, `data`, `agent`, `logger`, `seed`, the run
directory) and from `molt`, which holds raw Molt flags under Molt's own dotted names.

A key in `molt` that one of the structured nodes renders is refused with the name of its owner,
so a value is never set in two places (and FlashREINFORCE's importance correction is never
stacked on Molt's own). A `molt` key that Molt's parser does not know is refused with the closest
real flag. `actions` maps Molt's flag destinations to their argparse actions
(`molt_cli.flag_dests(molt_cli.build_parser())`).
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from molt_flashreinforce.algo_settings import Setting, flag_settings
from molt_flashreinforce.launch.errors import LaunchError
from molt_flashreinforce.plugin.cli_flags import PLUGIN_NAME, recipe_flags

MOLT_ENTRY_MODULE = "molt_flashreinforce.launch.molt_main"
# Environment variables molt_main forwards to every Ray worker (comma-separated names).
WORKER_ENV_VARIABLE = "MOLT_FLASHREINFORCE_WORKER_ENV"
CHECKPOINT_SUBDIR = "ckpt"
EXPORTS_SUBDIR = "exports"  # <run_dir>/exports/step_<N>/ (plugin/exports.py)
TENSORBOARD_SUBDIR = "tensorboard"

_REDUCTION_FLAGS = {"sample_mean": "seq-mean-token-mean", "token_mean": "token-mean"}
# Molt's importance-correction flags, which the recipe sets (and GRPO's baseline turns off).
_IMPORTANCE_KEYS = tuple(dest for dest in recipe_flags(0.0) if dest.startswith("algo.advantage.is_correction"))


@dataclass(frozen=True)
class EnvReference:
    """A flag value read from the environment at launch; recorded as "$NAME", never its value."""

    name: str


FlagValue = str | EnvReference


@dataclass
class MoltCommand:
    flags: list[tuple[str, list[FlagValue]]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, environ: Mapping[str, str] | None = None, missing: str | None = None) -> list[str]:
        """The flags with environment references resolved (`missing` stands in for unset ones)."""
        environ = os.environ if environ is None else environ
        out: list[str] = []
        for flag, values in self.flags:
            out.append(flag)
            for value in values:
                if isinstance(value, EnvReference):
                    resolved = environ.get(value.name) or missing
                    if resolved is None:
                        raise LaunchError(f"{flag} needs the environment variable {value.name}; export it.")
                    out.append(resolved)
                else:
                    out.append(value)
        return out

    def shell(self, python: str = "python") -> str:
        """A runnable, shell-quoted command line, one flag per line."""
        prefix = " ".join(f"{key}={shlex.quote(value)}" for key, value in self.env.items())
        lines = [f"{prefix} {shlex.quote(python)} -m {MOLT_ENTRY_MODULE}".strip()]
        for flag, values in self.flags:
            rendered = [f'"${value.name}"' if isinstance(value, EnvReference) else shlex.quote(value) for value in values]
            lines.append(" ".join([flag, *rendered]))
        return " \\\n    ".join(lines) + "\n"


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    return str(value)


class _Flags:
    """Ordered flags with their owners, so `molt` keys can be checked against them."""

    def __init__(self) -> None:
        self.command = MoltCommand()
        self.owner: dict[str, str] = {}

    def add(self, dest: str, owner: str, *values: Any) -> None:
        self.owner[dest] = owner
        self.command.flags.append((f"--{dest}", [v if isinstance(v, EnvReference) else format_value(v) for v in values]))

    def own(self, dest: str, owner: str) -> None:
        """Claim a key that is deliberately not rendered (e.g. GRPO's unused IS threshold)."""
        self.owner[dest] = owner

    def add_setting(self, algo: DictConfig, setting: Setting) -> None:
        """`--flashreinforce.<name>` from `algo.<name>`; an unset optional one is owned, not rendered."""
        dest, value = f"{PLUGIN_NAME}.{setting.name}", algo.get(setting.name)
        if value is None:
            self.own(dest, f"algo.{setting.name}")
        else:
            self.add(dest, f"algo.{setting.name}", setting.type(value))


def _algo_flags(flags: _Flags, algo: DictConfig, placement: DictConfig) -> None:
    name = algo.name
    if name == "flashreinforce":
        owner = "algo (algo.delta, algo.gate_level, algo.gate_mean, algo.importance_sampling)"
        # Molt's recipe form of FlashREINFORCE: force_on_policy makes PPO's ratio exactly 1, so the
        # surrogate is REINFORCE, and the seq binary-KL mask is the trust region. Our plugin's
        # PolicyLoss replaces that composition with the full objective and reads --flashreinforce.*.
        flags.add("algo.advantage.estimator", "algo", "flashreinforce")
        flags.add("actor.loss_mode", "algo", "flashreinforce")
        for dest, values in recipe_flags(algo.delta).items():
            flags.add(dest, "algo.reduction" if dest == "actor.loss_agg_mode" else owner, *values)
        flags.add("train.force_on_policy", "algo (one optimizer step per batch)")
        flags.add("train.max_epochs", "algo (one optimizer step per batch)", 1)
        flags.add("rollout.n_samples_per_prompt", "algo.group_size", int(algo.group_size))
        flags.add("algo.kl.init_coef", "algo (no reference KL)", 0)
        for setting in flag_settings():
            if setting.name == "fused_head":
                # The fused head needs the whole lm_head in each actor rank: a placement that shards the
                # vocabulary (tp) or the sequence (cp) keeps Molt's own head.
                whole_head = placement.actor.tp == 1 and placement.actor.cp == 1
                flags.add(f"{PLUGIN_NAME}.fused_head", "algo.fused_head and placement.actor (tp, cp)",
                          bool(algo.fused_head) and whole_head)
            elif setting.name != "max_policy_lag":  # every algorithm's: below
                flags.add_setting(algo, setting)
    elif name == "grpo":
        flags.add("algo.advantage.estimator", "algo", "grpo")
        flags.add("actor.loss_mode", "algo", "ppo")
        flags.add("algo.advantage.no_whiten", "algo")
        if algo.reduction not in _REDUCTION_FLAGS:
            raise LaunchError(f"algo.reduction={algo.reduction!r} is not a GRPO reduction; use token_mean.")
        flags.add("actor.loss_agg_mode", "algo.reduction", _REDUCTION_FLAGS[algo.reduction])
        flags.add("rollout.n_samples_per_prompt", "algo.group_size", int(algo.group_size))
        flags.add("actor.eps_clip_low_high", "algo.clip_eps", float(algo.clip_eps), float(algo.clip_eps))
        flags.add("algo.advantage.is_correction_level", "algo (the GRPO baseline has no importance correction)", "off")
        for dest in _IMPORTANCE_KEYS[1:]:
            flags.own(dest, "algo (the GRPO baseline has no importance correction)")
        flags.add("train.force_on_policy", "algo (one optimizer step per batch)")
        flags.add("train.max_epochs", "algo (one optimizer step per batch)", 1)
        flags.add("algo.kl.init_coef", "algo (no reference KL)", 0)
    else:
        raise LaunchError(f"algo.name={name!r} is not known to the Molt launcher; use algo=flashreinforce or algo=grpo.")


def _placement_flags(flags: _Flags, placement: DictConfig) -> None:
    actor = placement.actor
    for prefix in ("actor", "ref"):  # the reference (unused at kl 0) mirrors the actor, as [X] does
        flags.add(f"{prefix}.num_nodes", "placement.actor.nodes", int(actor.nodes))
        flags.add(f"{prefix}.num_gpus_per_node", "placement.actor.gpus_per_node", int(actor.gpus_per_node))
    flags.add("fsdp.tp_size", "placement.actor.tp", int(actor.tp))
    flags.add("fsdp.ep_size", "placement.actor.ep", int(actor.ep))
    flags.add("fsdp.cp_size", "placement.actor.cp", int(actor.cp))
    flags.add("vllm.num_engines", "placement.vllm.engines", int(placement.vllm.engines))
    flags.add("vllm.tensor_parallel_size", "placement.vllm.tp", int(placement.vllm.tp))


def _export_flags(flags: _Flags, exports: DictConfig | None, run_dir: Path) -> None:
    steps = list(exports.steps) if exports is not None and exports.steps else []
    every = exports.every if exports is not None else None
    owner = "exports.steps and exports.every"
    if not steps and every is None:
        for dest in ("flashreinforce.export_steps", "flashreinforce.export_every", "flashreinforce.export_dir"):
            flags.own(dest, owner)
        return
    if steps:
        flags.add("flashreinforce.export_steps", "exports.steps", *(int(step) for step in steps))
    else:
        flags.own("flashreinforce.export_steps", "exports.steps")
    if every is not None:
        flags.add("flashreinforce.export_every", "exports.every", int(every))
    else:
        flags.own("flashreinforce.export_every", "exports.every")
    flags.add("flashreinforce.export_dir", "the run directory", str(run_dir / EXPORTS_SUBDIR))


def _logger_flags(flags: _Flags, logger: DictConfig, run_dir: Path) -> None:
    if logger.tensorboard:
        flags.add("logger.tensorboard_dir", "the run directory", str(run_dir / TENSORBOARD_SUBDIR))
    else:
        flags.own("logger.tensorboard_dir", "logger.tensorboard")
    flags.add("logger.wandb.run_name", "logger.run_name", logger.run_name)
    wandb = logger.wandb
    for key in ("project", "group", "org"):
        if wandb.enable and wandb[key] is not None:
            flags.add(f"logger.wandb.{key}", f"logger.wandb.{key}", wandb[key])
        else:
            flags.own(f"logger.wandb.{key}", f"logger.wandb.{key}")
    if wandb.enable:
        flags.add("logger.wandb.key", "logger.wandb.key_env", EnvReference(wandb.key_env))
    else:
        flags.own("logger.wandb.key", "logger.wandb.enable and logger.wandb.key_env")


def flatten(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested mapping -> [(dotted.key, leaf)], in insertion order."""
    if isinstance(node, Mapping) or isinstance(node, DictConfig):
        out = []
        for key, value in node.items():
            out.extend(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return [(prefix, node)]


def _owned_key_message(dest: str, owner: str, algo_name: str) -> str:
    if dest in _IMPORTANCE_KEYS and algo_name == "flashreinforce":
        return (
            f"molt.{dest} would apply importance correction twice: algo=flashreinforce already applies its "
            f"own ratio and trust region, and {owner} owns it. Remove molt.{dest}; use algo.delta, "
            "algo.gate_level or algo.importance_sampling instead."
        )
    if dest in ("train.max_epochs", "train.force_on_policy"):
        return (
            f"molt.{dest} is owned by {owner}: {algo_name} takes exactly one optimizer step on each fresh "
            f"batch. Remove molt.{dest}."
        )
    return f"molt.{dest} is owned by {owner}, which renders --{dest}. Remove molt.{dest} and set it there."


def _molt_node_flags(flags: _Flags, molt: DictConfig, actions: Mapping[str, argparse.Action], algo_name: str) -> None:
    for dest, value in flatten(OmegaConf.to_container(molt, resolve=True)):
        if dest in flags.owner:
            raise LaunchError(_owned_key_message(dest, flags.owner[dest], algo_name))
        if dest not in actions:
            close = difflib.get_close_matches(dest, list(actions), n=1, cutoff=0.5)
            hint = f" Did you mean molt.{close[0]}?" if close else ""
            raise LaunchError(f"molt.{dest} is not a Molt train_rl_ray flag.{hint} (`python -m molt.cli.train_rl_ray --help` lists them.)")
        if value is None:
            continue
        action = actions[dest]
        if isinstance(value, bool) and action.nargs == 0:
            if isinstance(action, argparse.BooleanOptionalAction):
                flags.add(dest if value else f"no-{dest}", f"molt.{dest}")
            elif value:
                flags.add(dest, f"molt.{dest}")
            continue
        values = value if isinstance(value, list) else [value]
        flags.add(dest, f"molt.{dest}", *values)


def agent_environment(cfg: DictConfig) -> dict[str, str]:
    """What the experiment's agent reads from its environment (Molt's examples' convention and
    ours): its turn limit, thinking on or off, its grader. The eval command gives its agents the same."""
    env = {"MAX_AGENT_TURNS": str(int(cfg.agent.max_turns)), "MATH_GRADER": str(cfg.agent.get("grader") or "strict")}
    if cfg.agent.get("enable_thinking") is not None:
        env["ENABLE_THINKING"] = format_value(bool(cfg.agent.enable_thinking))
    return env


def render_command(
    cfg: DictConfig,
    run_dir: Path,
    actions: Mapping[str, argparse.Action],
    agent_file: str,
    resume: bool,
    model_copy: Path | None,
) -> MoltCommand:
    """The Molt command for one job. `agent_file` is the resolved agent path; `resume` adds
    --ckpt.load_enable; `model_copy` is the context-extended copy of the model Molt loads, if any
    (`model_context.extended_copy_path`)."""
    flags = _Flags()
    # A model whose context is raised is loaded from the copy whose config.json allows it.
    extended = model_copy
    flags.add("actor.model_name_or_path", "model.name_or_path and model.max_position_embeddings",
              cfg.model.name_or_path if extended is None else str(extended))
    if cfg.data.train is not None:
        flags.add("data.prompt_dataset", "data.train", cfg.data.train)
    else:
        flags.own("data.prompt_dataset", "data.train")
    if cfg.data.eval is not None:
        flags.add("eval.dataset", "data.eval", cfg.data.eval)
    else:
        flags.own("eval.dataset", "data.eval")
    flags.add("train.agent_path", "agent.kind / agent.path", agent_file)
    flags.add("train.seed", "seed", int(cfg.seed))
    _placement_flags(flags, cfg.placement)
    _algo_flags(flags, cfg.algo, cfg.placement)
    # Every algorithm's: the bound is the plugin's, not the loss's.
    flags.add_setting(cfg.algo, next(s for s in flag_settings() if s.name == "max_policy_lag"))
    checkpoints = run_dir / CHECKPOINT_SUBDIR
    flags.add("ckpt.path", "the run directory", str(checkpoints / "state"))
    flags.add("ckpt.output_dir", "the run directory", str(checkpoints / "hf"))
    if resume:
        flags.add("ckpt.load_enable", "the run directory (resumes when it holds a checkpoint)")
    else:
        flags.own("ckpt.load_enable", "the run directory (resumes when it holds a checkpoint)")
    _export_flags(flags, cfg.get("exports"), run_dir)
    _logger_flags(flags, cfg.logger, run_dir)
    _molt_node_flags(flags, cfg.molt, actions, cfg.algo.name)

    agent_env = agent_environment(cfg)
    worker_env = [*agent_env, *cfg.agent.required_env]
    flags.command.env = {
        **agent_env,
        "RAY_USAGE_STATS_ENABLED": "0",
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "TOKENIZERS_PARALLELISM": "true",
        WORKER_ENV_VARIABLE: ",".join(worker_env),
    }
    return flags.command
