"""Means over seeds with 95 % bootstrap intervals, and the first crossing of a target.

Contract:
- `mean_ci(values)` -> {"mean", "ci95": [low, high], "n"}: the mean of the values (one per seed)
  and the 2.5th and 97.5th percentiles of the means of `BOOTSTRAP` resamples of them, drawn with
  replacement by a generator seeded with `RNG_SEED` (so a report is reproducible).
- `resample_indices(n)`: those resamples' indices, shape (BOOTSTRAP, n), for statistics of
  several arrays resampled jointly (paired seeds).
- `interval(samples)`: the percentile interval of bootstrap samples; an upper end that lies beyond
  what was measured (more than 2.5 % of the samples infinite) is inf.
- `first_crossing(xs, ys, target)`: the first x at which the curve reaches `target`, linearly
  interpolated between the points around it; inf when it never does.

With a handful of seeds a percentile bootstrap interval is narrower than the true 95 %: it can
only take values among the seeds' means. Used by the report (seed groups) and the tiny comparison
(experiments/tiny/summarize.py).
"""

from __future__ import annotations

import math

import numpy as np

BOOTSTRAP = 10_000
RNG_SEED = 0


def interval(samples: np.ndarray) -> list[float]:
    finite = samples[np.isfinite(samples)]
    if len(finite) < len(samples) * 0.975:  # the upper end lies beyond what was measured
        return [float(np.percentile(finite, 2.5)) if len(finite) else math.inf, math.inf]
    return [float(np.percentile(samples, 2.5)), float(np.percentile(samples, 97.5))]


def resample_indices(n: int) -> np.ndarray:
    return np.random.default_rng(RNG_SEED).integers(0, n, size=(BOOTSTRAP, n))


def mean_ci(values: list[float]) -> dict:
    values_array = np.asarray(values, dtype=float)
    means = values_array[resample_indices(len(values_array))].mean(axis=1)
    return {"mean": float(values_array.mean()), "ci95": interval(means), "n": len(values)}


def first_crossing(xs: np.ndarray, ys: np.ndarray, target: float) -> float:
    """The first x at which the curve reaches target, linearly interpolated (inf: never)."""
    above = np.nonzero(ys >= target)[0]
    if not len(above):
        return math.inf
    i = above[0]
    if i == 0:
        return float(xs[0])
    return float(xs[i - 1] + (target - ys[i - 1]) * (xs[i] - xs[i - 1]) / (ys[i] - ys[i - 1]))
