"""Our additions to Molt's `train_rl_ray` argument parser (no Molt import needed).

* `extend_choices(parser)`: Molt's argparse `choices` for `--algo.advantage.estimator` and
  `--actor.loss_mode` list its built-in names only and would reject `flashreinforce`.
* `add_plugin_arguments(parser)`: the `--flashreinforce.*` knobs. Molt's `hierarchize` turns
  them into `args.flashreinforce.*`, and `args` is pickled into every Ray actor, so the
  actors' loss reads the same values the driver validated. `--flashreinforce.max_policy_lag`
  applies to every algorithm (GRPO included): the generator and trainer patches of
  plugin/lag_bound.py read it.
"""

from __future__ import annotations

import argparse

from molt_flashreinforce.objective import GATE_LEVELS, GATE_MEANS, REDUCTIONS, FlashReinforceConfig

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
    defaults = FlashReinforceConfig()
    group = parser.add_argument_group("FlashREINFORCE (molt-flashreinforce)")
    group.add_argument("--flashreinforce.delta", type=float, default=defaults.delta,
                       help="Sequence trust region on the mean sampled-token Bernoulli KL; inf disables it")
    group.add_argument("--flashreinforce.gate_level", choices=GATE_LEVELS, default=defaults.gate_level,
                       help="sequence: drop whole trajectories (paper); token: drop single tokens")
    group.add_argument("--flashreinforce.gate_mean", choices=GATE_MEANS, default=defaults.gate_mean,
                       help="Average of the per-token KL inside the sequence gate")
    group.add_argument("--flashreinforce.reduction", choices=REDUCTIONS, default=defaults.reduction,
                       help="sample_mean (paper) | token_mean | constant_length")
    group.add_argument("--flashreinforce.constant_length", type=int, default=defaults.constant_length,
                       help="Length constant for reduction=constant_length")
    group.add_argument("--flashreinforce.importance_sampling", type=_boolean, default=defaults.importance_sampling,
                       help="false: no pi/mu ratio and no gate (the paper's no-IS ablation)")
    group.add_argument("--flashreinforce.max_policy_lag", type=int, default=None,
                       help="No trajectory more than this many updates old reaches the loss (unset: unbounded)")
    group.add_argument("--flashreinforce.entropy_filter_q", type=float, default=defaults.entropy_filter_q,
                       help="Keep the ceil(q*T) highest-entropy tokens of failed trajectories; 1 = off")
