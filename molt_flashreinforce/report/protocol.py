"""Measure a run the way the paper did, and find the paper number it compares with.

Contract:
- `metric_series(scalars, metric)`: the metric's values by step (tags averaged at the steps
  they share, scaled to the paper's unit), or None when the run lacks its tags.
- `measure(scalars, metric, at)`: one `Measurement` at the protocol point `at` (see
  `paper.At`); steps are never taken from after the protocol point. A metric the run did not
  log gives `missing="not in this run"` (with the absent tags in `detail`) instead of an error.
- `match_arm(experiment, run)`: the paper arm the run's resolved config reproduces (the
  matching arm with the most conditions), or the experiment's default arm when the run has no
  config. `paper_value(paper, experiment, row, arm)`: that arm's number for a table row,
  preferring the authors' own sources over secondary readings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from molt_flashreinforce import metrics as metric_names
from molt_flashreinforce.report.events import Series
from molt_flashreinforce.report.paper import Arm, At, Experiment, Metric, PaperResults, Reported, Row
from molt_flashreinforce.report.runs import MISSING, Run

NOT_IN_RUN = "not in this run"


@dataclass(frozen=True)
class Measurement:
    value: float | None  # in the metric's (paper's) unit
    step: int | None  # step the value was read at; for a mean, the last step averaged
    rollouts: float | None = None  # train/rollouts_consumed at that step, when logged
    missing: str | None = None  # short reason when value is None
    detail: str | None = None  # which tags or steps were missing


def metric_series(scalars: dict[str, Series], metric: Metric) -> Series | None:
    for alternative in metric.alternatives:
        if not all(tag in scalars for tag in alternative.tags):
            continue
        per_tag = [dict(scalars[tag]) for tag in alternative.tags]
        shared_steps = sorted(set.intersection(*(set(values) for values in per_tag)))
        series = []
        for step in shared_steps:
            value = fmean(values[step] for values in per_tag)
            series.append((step, (1.0 - value if alternative.complement else value) * metric.scale))
        return tuple(series)
    return None


def _value_at_or_before(series: Series, step: float) -> tuple[int, float] | None:
    before = [point for point in series if point[0] <= step]
    return before[-1] if before else None


def rollouts_at(scalars: dict[str, Series], step: int) -> float | None:
    point = _value_at_or_before(scalars.get(metric_names.ROLLOUTS_CONSUMED, ()), step)
    return point[1] if point else None


def measure(scalars: dict[str, Series], metric: Metric, at: At) -> Measurement:
    series = metric_series(scalars, metric)
    if not series:
        wanted = " or ".join(", ".join(alt.tags) for alt in metric.alternatives)
        problem = "no" if series is None else "never at one shared step:"
        return Measurement(None, None, missing=NOT_IN_RUN, detail=f"{problem} {wanted}")

    step_bound = at.bound
    if at.selector == "rollouts":
        consumed = scalars.get(metric_names.ROLLOUTS_CONSUMED)
        if not consumed:
            detail = f"no {metric_names.ROLLOUTS_CONSUMED} to locate {at.bound:,.0f} rollouts"
            return Measurement(None, None, missing=NOT_IN_RUN, detail=detail)
        within_budget = [step for step, total in consumed if total <= at.bound]
        if not within_budget:
            detail = f"its first logged step had already used {consumed[0][1]:,.0f} rollouts"
            return Measurement(None, None, missing="over budget from the start", detail=detail)
        step_bound = within_budget[-1]

    window = [point for point in series if point[0] <= step_bound]
    if not window:
        return Measurement(None, None, missing=f"nothing at or before step {step_bound:,.0f}",
                           detail=f"first value at step {series[0][0]}")
    if at.selector == "peak":
        # max() keeps the first of equal values: the earliest step that reached the best score.
        step, value = max(window, key=lambda point: point[1])
    elif at.selector == "mean":
        step, value = window[-1][0], fmean(value for _, value in window)
    else:
        step, value = window[-1]
    return Measurement(value, step, rollouts_at(scalars, step))


def _config_matches(actual: Any, expected: Any) -> bool:
    if actual is MISSING:
        return False
    if isinstance(expected, bool) or isinstance(actual, bool):
        return actual is expected
    if isinstance(expected, (int, float)):
        try:
            return math.isclose(float(actual), float(expected), rel_tol=1e-9)  # accepts "inf" as written by YAML
        except (TypeError, ValueError):
            return False
    return str(actual) == str(expected)


def match_arm(experiment: Experiment, run: Run) -> tuple[Arm | None, bool]:
    """(arm, assumed): assumed is True when the run had no config and the default arm was used."""
    if run.config is None:
        return experiment.arms[experiment.default_arm], True
    matching = [
        arm for arm in experiment.arms.values()
        if arm.when is not None and all(_config_matches(run.get(key), value) for key, value in arm.when.items())
    ]
    if not matching:
        return None, False
    # max() keeps the first listed of equally specific arms.
    return max(matching, key=lambda arm: len(arm.when)), False


def paper_value(paper: PaperResults, experiment: Experiment, row: Row, arm: Arm | None) -> Reported | None:
    if arm is None:
        return None
    candidates = [entry for entry in experiment.reported if entry.row == row.id and entry.arm == arm.id]
    primary = [entry for entry in candidates if not paper.is_secondary(entry)]
    return (primary or candidates or [None])[0]
