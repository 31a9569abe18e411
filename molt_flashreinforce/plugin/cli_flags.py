"""Our additions to Molt's `train_rl_ray` command line (no Molt import needed).

* `extend_choices(parser)`: Molt's argparse `choices` for `--algo.advantage.estimator` and
  `--actor.loss_mode` list its built-in names only and would reject `flashreinforce`.
* `add_plugin_arguments(parser)`: the `--flashreinforce.*` knobs, one per flag setting of
  algo_settings.py. Molt's `hierarchize` turns them into `args.flashreinforce.*`, and `args` is
  pickled into every Ray actor, so the actors' loss reads the same values the driver validated.
  `--flashreinforce.max_policy_lag` applies to every algorithm (GRPO included): the lag bound
  (plugin/lag_bound.py) reads it. `--flashreinforce.export_steps`, `export_every` and
  `export_dir` (rendered from the `exports` node, not an algo setting) are read by
  plugin/exports.py after Molt's step.
* `recipe_flags(delta)`: Molt's own recipe form of FlashREINFORCE as Molt flags, which the
  launcher renders and `recipe_loss_kwargs` turns into the `PolicyLoss` arguments they make.
"""

from __future__ import annotations

import argparse
import math

from molt_flashreinforce.algo_settings import flag_settings

PLUGIN_NAME = "flashreinforce"
_CHOICE_FLAGS = ("algo.advantage.estimator", "actor.loss_mode")


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"true", "1", "yes"}:
        return True
    if lowered in {"false", "0", "no"}:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def extend_choices(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if action.dest in _CHOICE_FLAGS and action.choices is not None and PLUGIN_NAME not in action.choices:
            action.choices = [*action.choices, PLUGIN_NAME]


def add_plugin_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("FlashREINFORCE (molt-flashreinforce)")
    for setting in flag_settings():
        group.add_argument(f"--{PLUGIN_NAME}.{setting.name}", type=_boolean if setting.type is bool else setting.type,
                           choices=setting.choices, default=setting.default, help=setting.help)
    group.add_argument(f"--{PLUGIN_NAME}.export_steps", type=int, nargs="*", default=[],
                       help="Export the policy (HF format) after these steps into --flashreinforce.export_dir")
    group.add_argument(f"--{PLUGIN_NAME}.export_every", type=int, default=None,
                       help="Also export after every step that is a multiple of this")
    group.add_argument(f"--{PLUGIN_NAME}.export_dir", type=str, default=None,
                       help="Where the exports are kept, one step_<N>/ each, outside Molt's checkpoint rotation")


def recipe_flags(delta: float) -> dict[str, list]:
    """Molt's recipe form of FlashREINFORCE, flag -> values: the sequence-level binary-KL mask at
    `delta` is the trust region and seq-mean-token-mean the sample-mean reduction, so that Molt's
    stock `PolicyLoss` with our registered surrogate is the paper's default method."""
    return {
        "algo.advantage.is_correction_level": ["seq"],
        "algo.advantage.is_correction_gating": ["binary_kl"],
        "algo.advantage.is_correction_mode": ["mask"],
        "algo.advantage.is_correction_threshold": [float(delta)],
        "actor.loss_agg_mode": ["seq-mean-token-mean"],
    }


def recipe_loss_kwargs(delta: float) -> dict:
    """The `PolicyLoss` keyword arguments the recipe flags make (a single threshold reads as
    [-inf, threshold], as Molt's parser reads it)."""
    kwargs = {flag.rpartition(".")[2]: values[0] for flag, values in recipe_flags(delta).items()}
    kwargs["is_correction_threshold"] = [-math.inf, kwargs["is_correction_threshold"]]
    return kwargs
