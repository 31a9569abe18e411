"""Policy lag, measured: how many optimizer updates old the weights that generated a batch were.

Molt records no policy version on its rollouts, and queue depth does not fix the lag (partial
rollout keeps requests in flight across weight refits). `install()` (idempotent, run in every Ray
worker by our setup hook) patches two plain Molt classes, each used in its own Ray actor:

* `SamplesGenerator` (in `GenerateSamplesActor`): every rollout dispatched to the agent runners is
  stamped with its dispatch time, and each Experience of a finished group carries that stamp as
  the attribute `policy_dispatch_time` (an attribute, not an `info` entry, so Molt does not log
  it as a metric of its own).
* `BaseRLTrainer.train_step` (run by `TrainingActor`), and also on every class that `@ray.remote`
  already captured (`TrainingActor`'s `__ray_metadata__.modified_class`): Ray wraps each method,
  inherited ones included, when the decorator runs, so patching `BaseRLTrainer` after Molt's
  module is imported never reaches the actor. The trainer keeps the time at which each
  policy version went live in vLLM (version v = weights after v updates; `train_step` at
  `global_step` g updates and refits, so version g + 1 is live when it returns). A sample's version
  is the newest one live at its dispatch, its lag is g minus that version, and the step's status
  gains `policy_lag_mean` and `policy_lag_max`, which Molt logs as `train/policy_lag_mean` /
  `train/policy_lag_max` (metrics.POLICY_LAG_MEAN / POLICY_LAG_MAX). It also adds
  `rollouts_consumed` (trajectories trained on so far), the x-axis of the paper's budget comparisons,
  and `policy_versions_mixed_fraction`: the fraction of trajectories that finished under a newer
  version than the one live at their dispatch, i.e. whose tokens span several policy versions
  (a partial rollout across a refit; slime's staleness view next to the lag).

`install()` must run in the driver before Molt creates its actors (our launcher and the
`RAY_RUNTIME_ENV_HOOK` hook do), since the actor class is shipped to its worker from there.

Lag 0 is on-policy; Molt's queue of 1 without force_sync_mode gives lag 1 (the next batch is
generated while the current one trains). The version is the one at dispatch: under partial rollout
later tokens of a long rollout may come from newer weights, so this is the rollout's oldest
version (its first token's, or older). The generator and the trainer may run on different nodes:
their clocks are assumed synchronised to well under one training step.

With `--flashreinforce.max_policy_lag N` (plugin/lag_bound.py) each sample also carries the exact
version the generator read from the trainer's version board at dispatch (`policy_version`); the
lag is then read from it, with no clock involved, and the step's status gains
`policy_lag_at_bound` (1.0 when its oldest trajectory is exactly N updates old). A stamped sample
more than N updates old reaching `train_step` is a bug of the bound, and raises.
"""

from __future__ import annotations

import bisect
import functools
import time

from molt_flashreinforce import metrics
from molt_flashreinforce.plugin.patching import patch_once

DISPATCH_TIME_ATTRIBUTE = "policy_dispatch_time"
FINISH_TIME_ATTRIBUTE = "policy_finish_time"
VERSION_ATTRIBUTE = "policy_version"  # set only under a lag bound (plugin/lag_bound.py)
LAG_MEAN_KEY = metrics.POLICY_LAG_MEAN.removeprefix("train/")
LAG_MAX_KEY = metrics.POLICY_LAG_MAX.removeprefix("train/")
ROLLOUTS_CONSUMED_KEY = metrics.ROLLOUTS_CONSUMED.removeprefix("train/")
MIXED_VERSIONS_KEY = metrics.POLICY_VERSIONS_MIXED.removeprefix("train/")
AT_BOUND_KEY = metrics.POLICY_LAG_AT_BOUND.removeprefix("train/")
_INSTALLED_MARK = "_molt_flashreinforce_policy_lag"


class PolicyVersionClock:
    """When each policy version went live; answers which version was live at a given time."""

    def __init__(self, first_version: int) -> None:
        self._times = [float("-inf")]
        self._versions = [first_version]

    def went_live(self, version: int, at: float) -> None:
        self._times.append(at)
        self._versions.append(version)

    def version_at(self, moment: float) -> int:
        return self._versions[bisect.bisect_right(self._times, moment) - 1]


def dispatch_version(sample, clock: PolicyVersionClock) -> int:
    """The version live when the sample's rollout was dispatched: the board's exact stamp under a
    lag bound, else the clock's reading of its dispatch time."""
    version = getattr(sample, VERSION_ATTRIBUTE, None)
    return clock.version_at(getattr(sample, DISPATCH_TIME_ATTRIBUTE)) if version is None else version


def lag_statistics(samples, clock: PolicyVersionClock, global_step: int, bound: int | None = None) -> dict[str, float]:
    """{policy_lag_mean, policy_lag_max, policy_versions_mixed_fraction} over the stamped
    samples, plus policy_lag_at_bound when `bound` is set; {} when none is stamped."""
    stamped = [sample for sample in samples if getattr(sample, DISPATCH_TIME_ATTRIBUTE, None) is not None]
    if not stamped:
        return {}
    versions = [dispatch_version(sample, clock) for sample in stamped]
    lags = [global_step - version for version in versions]
    mixed = [
        clock.version_at(getattr(sample, FINISH_TIME_ATTRIBUTE, getattr(sample, DISPATCH_TIME_ATTRIBUTE))) > version
        for sample, version in zip(stamped, versions)
    ]
    stats = {
        LAG_MEAN_KEY: sum(lags) / len(lags),
        LAG_MAX_KEY: float(max(lags)),
        MIXED_VERSIONS_KEY: sum(mixed) / len(mixed),
    }
    if bound is not None:
        stats[AT_BOUND_KEY] = float(max(lags) == bound)
    return stats


def max_policy_lag(args) -> int | None:
    """`--flashreinforce.max_policy_lag` from Molt's parsed args (None: unbounded)."""
    return getattr(getattr(args, "flashreinforce", None), "max_policy_lag", None)


def check_bound(samples, global_step: int, bound: int | None) -> None:
    """Raise when a sample stamped by the lag bound is more than `bound` updates old."""
    if bound is None:
        return
    for sample in samples:
        version = getattr(sample, VERSION_ATTRIBUTE, None)
        if version is not None and global_step - version > bound:
            raise RuntimeError(
                f"a trajectory dispatched under policy version {version} reached train_step at step {global_step}, "
                f"{global_step - version} updates old, past --flashreinforce.max_policy_lag {bound}: the lag bound's "
                "generator gate and the trainer disagree on the step that trains this batch."
            )


def _patch_generator(generator_class) -> None:
    dispatch = generator_class._dispatch_to_agent_runners
    filter_group = generator_class._filter_group

    @functools.wraps(dispatch)
    def dispatch_and_stamp(self, *args, **kwargs):
        refs = dispatch(self, *args, **kwargs)
        stamps = self.__dict__.setdefault("_policy_dispatch_times", {})
        now = time.time()
        for ref in refs:
            stamps[ref] = now
        return refs

    @functools.wraps(filter_group)
    def filter_and_carry_stamp(self, finished_rollout, *args, **kwargs):
        samples = filter_group(self, finished_rollout, *args, **kwargs)
        stamp = self.__dict__.get("_policy_dispatch_times", {}).pop(finished_rollout, None)
        if stamp is not None:
            finished = time.time()
            for sample in samples:
                setattr(sample, DISPATCH_TIME_ATTRIBUTE, stamp)
                setattr(sample, FINISH_TIME_ATTRIBUTE, finished)
        return samples

    generator_class._dispatch_to_agent_runners = dispatch_and_stamp
    generator_class._filter_group = filter_and_carry_stamp


def _patch_trainer(trainer_class) -> None:
    train_step = trainer_class.train_step

    @functools.wraps(train_step)
    def train_step_with_lag(self, rollout_samples, global_step):
        clock = self.__dict__.get("_policy_version_clock")
        if clock is None:  # the weights vLLM holds at the first step (a resumed run starts above 0)
            clock = self._policy_version_clock = PolicyVersionClock(global_step)
        bound = max_policy_lag(self.args)
        check_bound(rollout_samples, global_step, bound)
        lag = lag_statistics(rollout_samples, clock, global_step, bound)
        status, next_step = train_step(self, rollout_samples, global_step)
        clock.went_live(next_step, time.time())
        status.update(lag)
        # The report's budget axis: one step trains exactly one rollout batch, so the count also
        # holds for a resumed run.
        rollout = self.args.rollout
        status[ROLLOUTS_CONSUMED_KEY] = float(next_step * rollout.batch_size * rollout.n_samples_per_prompt)
        return status, next_step

    trainer_class.train_step = train_step_with_lag


def ray_captured_trainer_classes(module) -> list[type]:
    """The classes `@ray.remote` built from `BaseRLTrainer` subclasses in `module`."""
    from molt.trainer.rl_trainer import BaseRLTrainer

    captured = (getattr(getattr(value, "__ray_metadata__", None), "modified_class", None) for value in vars(module).values())
    return [cls for cls in captured if isinstance(cls, type) and issubclass(cls, BaseRLTrainer)]


def install() -> None:
    """Patch Molt's generator and trainer classes in this process (idempotent)."""
    from molt.trainer import rl_trainer
    from molt.trainer.rollout.samples_generator import SamplesGenerator

    targets = [
        (SamplesGenerator, _patch_generator),
        (rl_trainer.BaseRLTrainer, _patch_trainer),
        *((cls, _patch_trainer) for cls in ray_captured_trainer_classes(rl_trainer)),
    ]
    patch_once(targets, _INSTALLED_MARK)
