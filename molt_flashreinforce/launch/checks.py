"""Fail-fast checks that run before any Ray or GPU work.

* `check_config(cfg)`: combinations that are wrong on any machine (raises `LaunchError`). Some of
  them Molt would catch only on the GPU actors, some never (an in-flight pool deeper than
  `algo.max_policy_lag` allows). It includes `check_context`.
* `check_context(cfg, model_max_positions, source)`: `molt.data.max_len` (Molt's context budget,
  which vLLM gets as max_model_len) against the context of the model Molt will load;
  `model_max_positions(cfg)` finds that context offline (see `model_context`).
* `check_grader(cfg)`: `agent.grader` is a math grader, for an agent that grades answers.
* `resolve_agent_file(cfg)`: the agent file a launch uses, or a problem describing why it is missing.
* `missing_resources(cfg, agent_problem, copy)`: what a real launch still needs (model directory,
  datasets, agent file, environment variables). A dry run prints these as warnings, a real launch
  refuses them. A dataset that exists but is malformed raises at once: that is a bug, not absence.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from molt_flashreinforce.algo_settings import SettingError
from molt_flashreinforce.algo_settings import check as check_algo
from molt_flashreinforce.launch import model_context
from molt_flashreinforce.launch.errors import LaunchError

# How many JSONL rows are parsed to check a dataset's shape (the whole file is not read).
DATASET_ROWS_CHECKED = 64
MOLT_DEFAULT_MAX_LEN = 2048  # Molt's --data.max_len default
# agents/grader_pool.RULES (a test keeps them equal): importing the agents starts grader machinery.
MATH_GRADERS = ("strict", "molt")


def _molt_value(cfg: DictConfig, dotted: str, default=None):
    value = OmegaConf.select(cfg.molt, dotted, default=default)
    return default if value is None else value


def _check_sampling(cfg: DictConfig) -> None:
    """FlashREINFORCE's ratio pi/mu needs mu's full support."""
    if cfg.algo.name != "flashreinforce" or not cfg.algo.importance_sampling:
        return
    top_p = float(_molt_value(cfg, "rollout.top_p", 1.0))
    if top_p < 1.0:
        raise LaunchError(
            f"molt.rollout.top_p={top_p} with importance sampling: the ratio pi/mu needs mu's full support, "
            "and top-p sampling gives tokens outside the nucleus probability 0. Use molt.rollout.top_p=1.0 "
            "(or algo.importance_sampling=false)."
        )
    top_k = OmegaConf.select(cfg.molt, "rollout.top_k", default=None)
    if top_k is not None and top_k > 0:
        raise LaunchError(
            f"molt.rollout.top_k={top_k} with importance sampling: top-k sampling gives every other token "
            "probability 0 under mu, so pi/mu is unsupported there. Remove molt.rollout.top_k."
        )


def _check_batches_and_placement(cfg: DictConfig) -> None:
    rollout_batch = int(_molt_value(cfg, "rollout.batch_size", 1024))
    train_batch = int(_molt_value(cfg, "train.batch_size", 128))
    samples = int(cfg.algo.group_size)
    if train_batch != rollout_batch * samples:
        raise LaunchError(
            f"molt.train.batch_size={train_batch} but molt.rollout.batch_size x algo.group_size = "
            f"{rollout_batch} x {samples} = {rollout_batch * samples}: each collected batch must be exactly one "
            f"optimizer step. Set molt.train.batch_size={rollout_batch * samples}."
        )
    placement = cfg.placement
    actor = placement.actor
    actor_gpus = int(actor.nodes) * int(actor.gpus_per_node)
    model_parallel = int(actor.tp) * int(actor.cp)
    if actor_gpus % model_parallel:
        raise LaunchError(
            f"placement.actor: {actor_gpus} actor GPUs are not divisible by tp x cp = {model_parallel}; change "
            "placement.actor.gpus_per_node, placement.actor.tp or placement.actor.cp."
        )
    data_parallel = actor_gpus // model_parallel
    if train_batch % data_parallel:
        raise LaunchError(
            f"the train batch of {train_batch} trajectories does not divide over {data_parallel} data-parallel actor "
            f"ranks (placement.actor: {actor_gpus} GPUs / (tp {actor.tp} x cp {actor.cp})). Choose an actor GPU count "
            f"whose data-parallel size divides {train_batch}."
        )
    needed = actor_gpus + int(placement.vllm.engines) * int(placement.vllm.tp)
    available = int(placement.nodes) * int(placement.gpus_per_node)
    if needed > available:
        raise LaunchError(
            f"placement needs {actor_gpus} actor GPUs + {placement.vllm.engines} vLLM engines x TP{placement.vllm.tp} "
            f"= {needed} GPUs but placement.nodes x placement.gpus_per_node = {available}. Lower "
            "placement.vllm.engines or raise placement.nodes (Ray would otherwise wait forever for GPUs)."
        )


def _check_policy_lag_bound(cfg: DictConfig) -> None:
    """The lag bound's gate (plugin/lag_bound.py) waits for the trainer; it must never wait for a step
    that itself waits for the batch being collected."""
    bound = cfg.algo.get("max_policy_lag")
    if bound is None:
        return
    groups = int(_molt_value(cfg, "rollout.batch_size", 1024))
    in_flight = int(_molt_value(cfg, "rollout.vllm_generate_batch_size", groups))
    # Molt turns partial rollout on itself when more rollouts are in flight than one batch holds.
    partial = bool(_molt_value(cfg, "train.partial_rollout_enable", False)) or in_flight > groups
    carried = math.ceil(in_flight / groups) if partial else 0
    if carried > bound:
        raise LaunchError(
            f"molt.rollout.vllm_generate_batch_size={in_flight} keeps rollouts in flight for up to {carried} batches of "
            f"{groups} under partial rollout, more than algo.max_policy_lag={bound} allows (the lag bound would wait "
            f"for training that waits for it); set molt.rollout.vllm_generate_batch_size to at most {bound * groups}"
            + (" or turn partial rollout off" if bound == 0 else "") + ".")
    if _molt_value(cfg, "ckpt.warm_resume_rollouts", False):
        raise LaunchError(
            f"molt.ckpt.warm_resume_rollouts=true with algo.max_policy_lag={bound}: the rollouts it restores carry no "
            "policy version, so the bound cannot hold for them; remove molt.ckpt.warm_resume_rollouts.")


def model_max_positions(cfg: DictConfig) -> tuple[int | None, str]:
    """(context of the model Molt will load, where it was read). With model.max_position_embeddings
    set that is the extended copy: its config.json once written, else the requested value."""
    name = str(cfg.model.name_or_path)
    native, source = model_context.native_max_positions(name)
    override = cfg.model.get("max_position_embeddings")
    if override is None:
        return native, source
    if native is not None and int(override) < native:
        raise LaunchError(f"model.max_position_embeddings={override} is below {native}, the context of {source}; "
                          "remove model.max_position_embeddings.")
    copy = model_context.extended_copy_path(cfg)
    written = model_context.config_max_positions(str(copy))
    if written is not None:
        return written, f"{copy}/config.json"
    return int(override), "model.max_position_embeddings"


def check_context(cfg: DictConfig, model_max_positions: int | None, source: str = "the model's config") -> None:
    """Raise `LaunchError` when molt.data.max_len exceeds the model's context (None: unknown, no check)."""
    max_len = int(_molt_value(cfg, "data.max_len", MOLT_DEFAULT_MAX_LEN))
    if model_max_positions is None or max_len <= model_max_positions:
        return
    if cfg.model.get("max_position_embeddings") is None:
        fix = (f"set model.max_position_embeddings={max_len} (a copy of the model whose config allows it) "
               "or lower molt.data.max_len")
    else:
        fix = f"raise model.max_position_embeddings to {max_len} or lower molt.data.max_len"
    raise LaunchError(f"molt.data.max_len={max_len} exceeds the model's context of {model_max_positions} positions "
                      f"({source}), so vLLM refuses max_model_len={max_len}: {fix}.")


def check_grader(cfg: DictConfig) -> None:
    """`agent.grader` names one of the math graders, and an agent that reads it."""
    grader = cfg.agent.get("grader") or "strict"
    if grader not in MATH_GRADERS:
        raise LaunchError(f"agent.grader={grader} is not one of {', '.join(MATH_GRADERS)}: strict (this package's "
                          "grader) or molt (the rules of Molt's example math grader).")
    if grader != "strict" and cfg.agent.kind == "alfworld" and not cfg.agent.path:
        raise LaunchError(f"agent.grader={grader}: the alfworld agent has no answers to grade (its reward is the "
                          "game's success); remove agent.grader.")


def check_config(cfg: DictConfig) -> None:
    """Raise `LaunchError` for any combination that cannot be right, whatever the machine."""
    if cfg.model.name_or_path is None:
        raise LaunchError("model.name_or_path is not set; the experiment sets it, or pass model.name_or_path=<id or path>.")
    try:
        check_algo(cfg.algo)  # every algo.* setting: algo_settings.py
    except SettingError as error:
        raise LaunchError(str(error)) from None
    _check_sampling(cfg)
    _check_batches_and_placement(cfg)
    _check_policy_lag_bound(cfg)
    # An explicit agent.path may read ENABLE_THINKING itself; of the shipped agents only python_tool does.
    if cfg.agent.get("enable_thinking") is not None and cfg.agent.kind != "python_tool" and not cfg.agent.path:
        raise LaunchError(f"agent.enable_thinking={cfg.agent.enable_thinking}: the shipped {cfg.agent.kind} agent ignores "
                          "it (only the python_tool agent reads it); remove agent.enable_thinking.")
    check_grader(cfg)
    check_context(cfg, *model_max_positions(cfg))


def resolve_agent_file(cfg: DictConfig) -> tuple[str, str | None]:
    """(agent file, problem or None). An explicit agent.path wins over agent.kind."""
    if cfg.agent.path:
        path = str(cfg.agent.path)
        if not path.endswith(".py"):
            raise LaunchError(f"agent.path={path} must be a Python file (Molt execs it and imports AgentRunner).")
        return path, None if Path(path).is_file() else f"agent file {path} (agent.path) does not exist"
    kind = cfg.agent.kind
    try:
        from molt_flashreinforce.agents import agent_path

        path = str(agent_path(kind))
    except (ImportError, KeyError, ValueError, FileNotFoundError) as error:
        return f"<agent file for {kind}>", f"no agent file for agent.kind={kind} ({error}); set agent.path=<file.py>"
    return path, None if Path(path).is_file() else f"agent file {path} for agent.kind={kind} does not exist"


def _dataset_problem(
    key: str, path: str | None, input_key: str, label_key: str | None, data_dir: str, experiment: str | None
) -> str | None:
    if path is None:
        return None
    if "," in path:
        raise LaunchError(
            f"{key}={path} holds a comma, and Molt reads --data.prompt_dataset / --eval.dataset as a comma-separated "
            "list of datasets; move the data to a path without one (a sweep's job directories join two or more "
            "overrides with commas: set hydra.sweep.subdir=${hydra.job.num} for such a sweep)")
    file = Path(path)
    if not file.exists():
        return (
            f"{key}={path} does not exist; write it with `molt-flashreinforce-data {experiment or '<experiment>'} "
            f"--out {data_dir}` "
            f"or point {key} at your dataset"
        )
    if file.is_dir() or file.suffix not in (".jsonl", ".json"):
        return None  # a saved Hugging Face dataset or another format Molt loads itself
    required = [k for k in (input_key, label_key) if k]
    rows = 0
    with file.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise LaunchError(f"{key}={path} line {number} is not JSON ({error.msg}); regenerate the dataset.") from None
            if not isinstance(row, dict) or any(k not in row for k in required):
                raise LaunchError(
                    f"{key}={path} line {number} lacks the field(s) {required} that molt.data.input_key / "
                    "molt.data.label_key name; regenerate the dataset or set those keys."
                )
            rows += 1
            if rows >= DATASET_ROWS_CHECKED:
                break
    if rows == 0:
        raise LaunchError(f"{key}={path} is empty; regenerate the dataset.")
    return None


def missing_resources(cfg: DictConfig, agent_problem: str | None, copy: Path | None) -> list[str]:
    """What a real launch still needs; empty when everything is in place (`copy`: the
    context-extended copy of the model the job loads, `model_context.extended_copy_path`)."""
    problems = []
    model = str(cfg.model.name_or_path)
    if model.startswith((".", "/", "~")) and not Path(model).expanduser().is_dir():
        problems.append(f"model.name_or_path={model} is not a directory")
    if copy is not None and model_context.config_max_positions(str(copy)) is None:
        positions = cfg.model.max_position_embeddings
        problems.append(
            f"{copy} (the copy of {model} with model.max_position_embeddings={positions}) does not exist; write it "
            f"with `python -m molt_flashreinforce.launch.model_context {model} --max-position-embeddings {positions} "
            f"--out {cfg.model.dir}`")
    input_key = _molt_value(cfg, "data.input_key", "input")
    label_key = _molt_value(cfg, "data.label_key")
    for key in ("data.train", "data.eval"):
        problem = _dataset_problem(
            key, OmegaConf.select(cfg, key), input_key, label_key, cfg.data.dir, cfg.experiment_name
        )
        if problem:
            problems.append(problem)
    if cfg.data.train is None:
        problems.append("data.train is not set; Molt needs a prompt dataset")
    if agent_problem:
        problems.append(agent_problem)
    for name in cfg.agent.required_env:
        if not os.environ.get(name):
            problems.append(f"environment variable {name} is unset; the {cfg.agent.kind} agent needs it on every worker")
        elif name.endswith("_DATA") and not Path(os.environ[name]).is_dir():
            problems.append(f"{name}={os.environ[name]} is not a directory")
    if cfg.logger.wandb.enable and not os.environ.get(cfg.logger.wandb.key_env):
        problems.append(f"logger.wandb.enable=true but {cfg.logger.wandb.key_env} is unset; export the W&B API key")
    return problems
