"""What a run had spent by the end of a step: training wall-clock, GPU-hours, generated and
trained tokens, so that a rollout budget can be read as compute.

Contract: `cost_at(scalars, placement, step) -> Cost`, each quantity cumulative over the run's
steps 1..step (0 at step 0: nothing was trained yet). A quantity the run's logs cannot give is
None, with the reason in `Cost.missing`; it is never made up as 0.

- wall-clock: the sum of the per-step `train/timing/step_total` (metrics.STEP_TIME), which Molt's
  trainer logs and the local backend logs under the same name. Start-up, evals and work lost
  to a crash before a resume are not in it: it is the time of the training steps the run kept.
- GPU-hours: the GPUs the run held (`placement.read_placement`) x wall-clock; n/a on a CPU.
- generated tokens (training rollouts; eval generations are not counted): the local backend's
  cumulative `train/generated_tokens`. Molt logs no token count, so for a Molt run it is the
  sum over steps of rollout/response_length_mean x rollout/num_samples: both describe the
  step's whole generated set, so their product is its response-token total.
- trained tokens: the local backend's `train/trained_tokens`. For Molt, the sum over steps of
  train/total_length (prompt + response, averaged over the trained samples) x the samples
  trained: rollout/num_samples less the remainder Molt's `balance_experiences` drops so that
  every data-parallel rank trains as many samples (one Experience per sample). Each sample is
  trained once: our launcher renders `--train.max_epochs 1` for both algorithms.
Sums over steps need every step 1..step logged, as Molt does at `logger.logging_steps` 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from molt_flashreinforce import metrics as metric_names
from molt_flashreinforce.report.events import Series
from molt_flashreinforce.report.placement import Placement

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Cost:
    wall_s: float | None
    gpu_hours: float | None
    generated_tokens: float | None
    trained_tokens: float | None
    missing: tuple[str, ...] = ()  # "<quantity>: <why>" for each None above


@dataclass(frozen=True)
class _Reading:
    value: float | None
    missing: str | None = None


def cost_at(scalars: dict[str, Series], placement: Placement, step: int) -> Cost:
    wall = _summed(scalars, step, (metric_names.STEP_TIME,), lambda seconds: seconds)
    if wall.value is None:
        gpu_hours = _Reading(None, "needs the wall-clock")
    elif placement.gpus is None:
        gpu_hours = _Reading(None, placement.missing)
    else:
        gpu_hours = _Reading(placement.gpus * wall.value / SECONDS_PER_HOUR)
    generated = _tokens(scalars, step, placement, metric_names.GENERATED_TOKENS, _molt_generated_tokens)
    trained = _tokens(scalars, step, placement, metric_names.TRAINED_TOKENS, _molt_trained_tokens)
    readings = {"wall-clock": wall, "GPU-hours": gpu_hours, "generated tokens": generated, "trained tokens": trained}
    return Cost(wall.value, gpu_hours.value, generated.value, trained.value,
                tuple(f"{name}: {reading.missing}" for name, reading in readings.items() if reading.value is None))


_Derivation = Callable[[dict[str, Series], int, Placement], _Reading]


def _tokens(scalars: dict[str, Series], step: int, placement: Placement, counter: str, derive: _Derivation) -> _Reading:
    """The cumulative counter the local backend logs, else what Molt's per-step means give."""
    if counter in scalars:
        before = [value for logged_step, value in scalars[counter] if logged_step <= step]
        return _Reading(before[-1]) if before else _Reading(None, f"no {counter} at or before step {step}")
    derived = derive(scalars, step, placement)
    return derived if derived.value is not None else _Reading(None, f"no {counter}, and {derived.missing}")


def _molt_generated_tokens(scalars: dict[str, Series], step: int, placement: Placement) -> _Reading:
    del placement  # every generated sample counts, trained or not
    return _summed(scalars, step, (metric_names.RESPONSE_LENGTH_MEAN, metric_names.NUM_SAMPLES),
                   lambda length_mean, samples: length_mean * samples)


def _molt_trained_tokens(scalars: dict[str, Series], step: int, placement: Placement) -> _Reading:
    tags, ranks = (metric_names.TOTAL_LENGTH_MEAN, metric_names.NUM_SAMPLES), placement.dp_ranks
    if ranks is None and all(tag in scalars for tag in tags):
        return _Reading(None, f"no data-parallel rank count to size the trained batch ({placement.missing})")

    def step_tokens(length_mean: float, samples: float) -> float:
        kept = round(samples) - round(samples) % ranks  # balance_experiences drops the remainder
        return length_mean * kept

    return _summed(scalars, step, tags, step_tokens)


def _summed(scalars: dict[str, Series], step: int, tags: tuple[str, ...], per_step: Callable[..., float]) -> _Reading:
    """per_step(values of `tags` at s) summed over s = 1..step."""
    absent = [tag for tag in tags if tag not in scalars]
    if absent:
        return _Reading(None, "no " + " or ".join(absent))
    by_tag = [dict(scalars[tag]) for tag in tags]
    unlogged = [s for s in range(1, step + 1) if not all(s in values for values in by_tag)]
    if unlogged:
        return _Reading(None, f"{' x '.join(tags)} not logged at {len(unlogged)} of steps 1-{step} (first: "
                              f"{unlogged[0]}); Molt logs every logger.logging_steps steps")
    return _Reading(math.fsum(per_step(*(values[s] for values in by_tag)) for s in range(1, step + 1)))
