"""The launcher's validation layer: every bad input is refused before any work, in one line.

    check_overrides(overrides, multirun)   # command line, before Hydra composes: unknown keys and options
    validate(cfg)                          # the composed config, before the run directory is written

Both raise `LaunchError` (launch/errors.py), whose message is one line naming the full key, the bad
value and the fix; the CLI (app/shell.py) prints it once on stderr and exits with status 2.

* `check_overrides` composes the config the way Hydra will (once per combination of swept config
  groups) and turns Hydra's composition errors into "did you mean ...?" lines: an unknown key gets
  the closest existing keys (Hydra itself would advise adding it with `+`), an unknown group option
  the closest options. Errors it does not recognise are left to Hydra, so nothing is lost.
* `validate` checks the backend, the rehearsal, `cluster.*` and `resilience.*` settings, the seed, the `algo` node
  (every setting as algo_settings.py declares it), and for backend=molt the Molt launch checks
  (`checks.check_config`); the CPU backend checks its own `local.*` (`local.config.check`).

Nothing here imports torch, Ray or Molt: a refusal takes well under a second.
"""

from __future__ import annotations

import difflib
import itertools
import math
from typing import Any, Iterable

from omegaconf import DictConfig, OmegaConf

from molt_flashreinforce.algo_settings import SettingError
from molt_flashreinforce.algo_settings import check as check_algo
from molt_flashreinforce.launch.errors import LaunchError

BACKENDS = ("local", "molt")
REHEARSAL_MODES = ("cpu", "gpu")  # rehearsal/cpu.yaml, rehearsal/gpu.yaml
CONFIG_MODULE = "molt_flashreinforce.conf"
CONFIG_NAME = "config"


def _closest(word: str, candidates: Iterable[str], count: int = 3) -> list[str]:
    return difflib.get_close_matches(word, list(candidates), n=count, cutoff=0.7)


def _did_you_mean(word: str, candidates: Iterable[str], render=lambda c: c) -> str:
    close = _closest(word, candidates)
    return f"; did you mean {' or '.join(render(c) for c in close)}?" if close else ""


# ---------------------------------------------------------------------------------------------
# The command line, before Hydra composes it.


def _dotted_keys(node: Any, prefix: str = "") -> list[str]:
    keys = []
    if isinstance(node, dict):
        for name, value in node.items():
            key = f"{prefix}{name}"
            keys.append(key)
            keys += _dotted_keys(value, f"{key}.")
    return keys


def _group_combinations(group_overrides: list) -> list[list[str]]:
    """Every combination of the config-group choices a sweep makes."""
    choices = []
    for override in group_overrides:
        if override.is_sweep_override():
            key = override.get_key_element()
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            choices.append([override.input_line])
    return [list(combination) for combination in itertools.product(*choices)]


def _first_value(override) -> str:
    """A swept `key=a,b` as `key=a`: each job composes one value, and the keys are what is checked."""
    if not override.is_sweep_override():
        return override.input_line
    return f"{override.get_key_element()}={next(iter(override.sweep_string_iterator()))}"


def _unknown_key_message(full_key: str, given: str, composed: dict, groups: list[str]) -> str:
    parent, _, name = full_key.rpartition(".")
    known = _dotted_keys(composed)
    siblings = [k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == parent]
    close = [f"{parent}.{leaf}" if parent else leaf for leaf in _closest(name, siblings)] or _closest(full_key, known, 2)
    if close:
        hint = f"; did you mean {' or '.join(close)}?"
    elif siblings:
        hint = f"; {parent or 'the top level'} has: {', '.join(siblings)}"
    else:
        hint = ""
    where = f" (with {' '.join(groups)})" if groups else ""
    return f"{given}: {full_key} is not a key of the config{where}{hint}"


def check_overrides(overrides: list[str], multirun: bool = False) -> None:
    """Refuse unknown keys and unknown config-group options with the closest names."""
    from hydra import compose, initialize_config_module
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException:
        return  # Hydra's own message quotes the malformed override
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        from hydra.core.global_hydra import GlobalHydra

        loader = GlobalHydra.instance().config_loader()
        top_groups = set(loader.list_groups(""))
        is_group = [o.key_or_group in top_groups or "/" in o.key_or_group for o in parsed]
        group_overrides = [o for o, group in zip(parsed, is_group) if group]
        # hydra.* settings shape the run, not the job's config: Hydra checks them itself.
        value_overrides = [o for o, group in zip(parsed, is_group) if not group and not o.key_or_group.startswith("hydra.")]
        combinations = _group_combinations(group_overrides) if multirun else [[o.input_line for o in group_overrides]]
        for groups in combinations:
            try:
                compose(config_name=CONFIG_NAME, overrides=groups + [_first_value(o) for o in value_overrides])
            except MissingConfigException as error:
                _refuse_missing_option(error, parsed, loader)
                return
            except ConfigCompositionException as error:
                if "You must specify 'experiment'" in str(error):
                    raise LaunchError(missing_experiment_message()) from None
                full_key = getattr(error.__cause__, "full_key", None)
                if not full_key or "is not in struct" not in str(error.__cause__):
                    return
                given = next((o.input_line for o in value_overrides if o.key_or_group == full_key), full_key)
                composed = OmegaConf.to_container(
                    compose(config_name=CONFIG_NAME, overrides=groups), resolve=False)
                raise LaunchError(_unknown_key_message(full_key, given, composed, groups if multirun and len(combinations) > 1 else [])) from None
        if multirun:
            launcher_overrides = [_first_value(o) for o in parsed if o.key_or_group.startswith("hydra.launcher.")]
            _check_slurm_warning(compose(config_name=CONFIG_NAME, return_hydra_config=True,
                                         overrides=combinations[0] + launcher_overrides).hydra.launcher)


def _check_slurm_warning(launcher) -> None:
    """SLURM sends its time-limit warning `signal_delay_s` before the limit; a lead not shorter than
    the limit warns at once, and the job checkpoints and requeues itself before it trains."""
    if "signal_delay_s" not in launcher or "timeout_min" not in launcher:
        return
    limit_s = int(launcher.timeout_min) * 60
    if int(launcher.signal_delay_s) >= limit_s:
        raise LaunchError(
            f"hydra.launcher.signal_delay_s={launcher.signal_delay_s} is not shorter than hydra.launcher.timeout_min="
            f"{launcher.timeout_min} ({limit_s} s): SLURM would send its time-limit warning at once and every job would "
            f"requeue itself before training; set hydra.launcher.signal_delay_s={max(limit_s // 10, 1)} or a longer "
            "hydra.launcher.timeout_min")


def _refuse_missing_option(error, parsed: list, loader) -> None:
    missing = str(getattr(error, "missing_cfg_file", "") or "")
    group, _, option = missing.rpartition("/")
    if not group:
        return
    override = next((o for o in parsed if o.key_or_group == group), None)
    given = override.input_line if override is not None else f"{group}={option}"
    if option == "???":
        return
    options = sorted(loader.get_group_options(group))
    if not options:
        return
    hint = _did_you_mean(option, options, render=lambda c: f"{group}={c}")
    raise LaunchError(f"{given}: {group} has no option {option!r}{hint} (options: {', '.join(options)})")


def missing_experiment_message() -> str:
    from molt_flashreinforce import conf

    return f"experiment is not set; pass experiment=<name>, one of: {', '.join(conf.experiments())}"


# ---------------------------------------------------------------------------------------------
# The composed config.


def _number(key: str, value: Any, fix: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LaunchError(f"{key}={value} is not a number; {fix}")
    return float(value)


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        hint = _did_you_mean(str(value), choices, render=lambda c: f"{key}={c}")
        raise LaunchError(f"{key}={value} is not one of {', '.join(choices)}{hint}")


def _boolean(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise LaunchError(f"{key}={value} must be true or false")


def _integer(key: str, value: Any, minimum: int, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise LaunchError(f"{key}={value} must be an integer >= {minimum}; {fix}")


def _check_rehearsal(cfg: DictConfig) -> None:
    rehearsal = cfg.rehearsal
    if rehearsal.mode is None:
        return
    if rehearsal.mode not in REHEARSAL_MODES:
        raise LaunchError(f"rehearsal.mode={rehearsal.mode} is unknown; use rehearsal=cpu or rehearsal=gpu, or leave "
                          "it unset for a GPU launch")
    if cfg.backend != "molt":
        raise LaunchError(f"rehearsal={rehearsal.mode} rehearses a Molt (GPU) job, but backend={cfg.backend}; "
                          f"experiment=tiny already runs on the CPU: drop rehearsal={rehearsal.mode}")
    _boolean("rehearsal.resume", rehearsal.resume)
    for key, fix in (("steps", "e.g. rehearsal.steps=4"), ("trajectories_per_step", "e.g. rehearsal.trajectories_per_step=8"),
                     ("max_new_tokens", "e.g. rehearsal.max_new_tokens=24"), ("max_turns", "e.g. rehearsal.max_turns=3")):
        _integer(f"rehearsal.{key}", rehearsal[key], 1, fix)
    if rehearsal.save_steps is not None:
        _integer("rehearsal.save_steps", rehearsal.save_steps, 1, "e.g. rehearsal.save_steps=2 (null: at the end only)")
    steps = rehearsal.get("export_steps")
    if steps is None or isinstance(steps, (str, int)) or not all(
            isinstance(step, int) and not isinstance(step, bool) and step >= 1 for step in steps):
        raise LaunchError(f"rehearsal.export_steps={steps} must be a list of steps >= 1, e.g. rehearsal.export_steps=[2] "
                          "(rehearsal.export_steps=[] for none)")
    for key in ("stall_timeout_s", "startup_timeout_s", "checkpoint_wait_s"):
        if not 0 < _number(f"rehearsal.{key}", rehearsal[key], f"e.g. rehearsal.{key}=300") < math.inf:
            raise LaunchError(f"rehearsal.{key}={rehearsal[key]} must be a positive number of seconds, e.g. rehearsal.{key}=300")


def _check_exports(exports: DictConfig | None) -> None:
    if exports is None:
        return
    steps = exports.steps
    if steps is None or isinstance(steps, (str, int)) or not all(
            isinstance(step, int) and not isinstance(step, bool) and step >= 1 for step in steps):
        raise LaunchError(f"exports.steps={steps} must be a list of optimizer steps >= 1, e.g. exports.steps=[2000] "
                          "(exports.steps=[] for none)")
    if exports.every is not None:
        _integer("exports.every", exports.every, 1, "e.g. exports.every=1024, or exports.every=null for none")


def _check_cluster(cluster: DictConfig) -> None:
    _integer("cluster.ray_port", cluster.ray_port, 1, "use a free TCP port such as cluster.ray_port=6379")
    if cluster.ray_port > 65535:
        raise LaunchError(f"cluster.ray_port={cluster.ray_port} is not a TCP port; use one below 65536 such as 6379")
    timeout = _number("cluster.join_timeout_s", cluster.join_timeout_s, "e.g. cluster.join_timeout_s=600")
    if not 0 < timeout < math.inf:
        raise LaunchError(f"cluster.join_timeout_s={cluster.join_timeout_s} must be a positive number of seconds, "
                          "e.g. cluster.join_timeout_s=600")


def _check_resilience(resilience: DictConfig) -> None:
    _integer("resilience.max_restarts", resilience.max_restarts, 0, "e.g. resilience.max_restarts=3 (0: never restart)")
    _integer("resilience.max_requeues", resilience.max_requeues, 0, "e.g. resilience.max_requeues=20 (0: never requeue)")
    for key, example in (("stall_timeout_s", 1800), ("startup_timeout_s", 3600), ("checkpoint_wait_s", 600)):
        value = _number(f"resilience.{key}", resilience[key], f"e.g. resilience.{key}={example}")
        if not 0 < value < math.inf:
            raise LaunchError(f"resilience.{key}={resilience[key]} must be a positive number of seconds, "
                              f"e.g. resilience.{key}={example}")


def validate(cfg: DictConfig) -> None:
    """Raise `LaunchError` for the first bad value of a composed config; return None when it is fine."""
    _choice("backend", cfg.backend, BACKENDS)
    _check_rehearsal(cfg)
    _check_cluster(cfg.cluster)
    _check_resilience(cfg.resilience)
    _boolean("dry_run", cfg.dry_run)
    _integer("seed", cfg.seed, 0, "use a non-negative integer such as seed=0")
    _check_exports(cfg.get("exports"))
    if cfg.backend == "molt":
        from molt_flashreinforce.launch.checks import check_config

        check_config(cfg)  # the algo node's settings first, then the Molt launch's
    else:
        try:
            check_algo(cfg.algo)  # every algo.* setting: algo_settings.py
        except SettingError as error:
            raise LaunchError(str(error)) from None
