"""Policy lag, measured: how many optimizer updates old the weights that generated a batch were.

Molt records no policy version on its rollouts, and queue depth does not fix the lag (partial
rollout keeps requests in flight across weight refits). `HOOKS` (run at Molt's seams,
plugin/seams.py, in every Ray worker and the driver):

* the generator (in `GenerateSamplesActor`): every rollout dispatched to the agent runners is
  stamped with its dispatch time, and each Experience of a finished group carries that stamp as
  the attribute `policy_dispatch_time` (an attribute, not an `info` entry, so Molt does not log
  it as a metric of its own).
* the train step (in `TrainingActor`): the trainer keeps the time at which each
  policy version went live in vLLM (version v = weights after v updates; `train_step` at
  `global_step` g updates and refits, so version g + 1 is live when it returns). A sample's version
  is the newest one live at its dispatch, its lag is g minus that version, and the step's status
  gains `policy_lag_mean` and `policy_lag_max`, which Molt logs as `train/policy_lag_mean` /
  `train/policy_lag_max` (metrics.POLICY_LAG_MEAN / POLICY_LAG_MAX). It also adds
  `rollouts_consumed` (trajectories trained on so far), the x-axis of the paper's budget comparisons,
  and `policy_versions_mixed_fraction`: the fraction of trajectories that finished under a newer
  version than the one live at their dispatch, i.e. whose tokens span several policy versions
  (a partial rollout across a refit; slime's staleness view next to the lag).

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
import time

from molt_flashreinforce import metrics
from molt_flashreinforce.plugin.seams import RuntimeHooks

DISPATCH_TIME_ATTRIBUTE = "policy_dispatch_time"
FINISH_TIME_ATTRIBUTE = "policy_finish_time"
VERSION_ATTRIBUTE = "policy_version"  # set only under a lag bound (plugin/lag_bound.py)
LAG_MEAN_KEY = metrics.step_key(metrics.POLICY_LAG_MEAN)
LAG_MAX_KEY = metrics.step_key(metrics.POLICY_LAG_MAX)
ROLLOUTS_CONSUMED_KEY = metrics.step_key(metrics.ROLLOUTS_CONSUMED)
MIXED_VERSIONS_KEY = metrics.step_key(metrics.POLICY_VERSIONS_MIXED)
AT_BOUND_KEY = metrics.step_key(metrics.POLICY_LAG_AT_BOUND)


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


class LagProbe(RuntimeHooks):
    """The probe's part at Molt's seams (plugin/seams.py)."""

    def dispatched(self, generator, refs, prompts) -> None:
        stamps = generator.__dict__.setdefault("_policy_dispatch_times", {})
        now = time.time()
        for ref in refs:
            stamps[ref] = now

    def collected(self, generator, finished, samples, drop_counts):
        stamp = generator.__dict__.get("_policy_dispatch_times", {}).pop(finished, None)
        if stamp is not None:
            finished_at = time.time()
            for sample in samples:
                setattr(sample, DISPATCH_TIME_ATTRIBUTE, stamp)
                setattr(sample, FINISH_TIME_ATTRIBUTE, finished_at)
        return samples

    def train_step_starting(self, trainer, samples, global_step) -> None:
        if trainer.__dict__.get("_policy_version_clock") is None:  # the weights vLLM holds at the first step
            trainer._policy_version_clock = PolicyVersionClock(global_step)  # (a resumed run starts above 0)
        bound = max_policy_lag(trainer.args)
        check_bound(samples, global_step, bound)
        trainer._policy_lag_pending = lag_statistics(samples, trainer._policy_version_clock, global_step, bound)

    def train_step_ended(self, trainer, samples, global_step, status, next_step) -> None:
        trainer._policy_version_clock.went_live(next_step, time.time())
        status.update(trainer.__dict__.pop("_policy_lag_pending", {}))
        # The report's budget axis: one step trains exactly one rollout batch, so the count also
        # holds for a resumed run.
        rollout = trainer.args.rollout
        status[ROLLOUTS_CONSUMED_KEY] = float(next_step * rollout.batch_size * rollout.n_samples_per_prompt)


HOOKS = LagProbe()
