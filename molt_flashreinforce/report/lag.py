"""Each run's measured policy lag beside the lag the paper states for its arm.

Contract: `lag_rows(paper, experiment, runs)` returns one `LagRow` per run: the mean of
`train/policy_lag_mean` and the largest `train/policy_lag_max` over the protocol's steps (those at
or before the experiment's `horizon_steps`, all of them when it has none), the paper's lag for the
run's arm (the experiment's row measuring `train/policy_lag_mean`; None when the paper states
none) and `off`: the mean differs from the paper's lag by more than `TOLERANCE`, or the max
exceeds it by more than that. `markdown(experiment, rows)` renders them as Markdown lines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import fmean

from molt_flashreinforce import metrics as metric_names
from molt_flashreinforce.report.paper import Experiment, PaperResults, Reported
from molt_flashreinforce.report.protocol import match_arm, paper_value

TOLERANCE = 1.0  # updates


@dataclass(frozen=True)
class LagRow:
    run_label: str
    last_step: int | None  # the last protocol step with a lag; None: the run logged no lag
    mean: float | None
    max: float | None
    paper: Reported | None

    @property
    def off(self) -> bool:
        if self.paper is None or self.paper.value is None or self.mean is None:
            return False
        return abs(self.mean - self.paper.value) > TOLERANCE or self.max - self.paper.value > TOLERANCE


def _paper_lag(paper: PaperResults, experiment: Experiment, run) -> Reported | None:
    arm, _ = match_arm(experiment, run)
    for row in experiment.rows:
        tags = experiment.metrics[row.metric].alternatives[0].tags
        if tags == (metric_names.POLICY_LAG_MEAN,):
            return paper_value(paper, experiment, row, arm)
    return None


def lag_rows(paper: PaperResults, experiment: Experiment, runs) -> list[LagRow]:
    horizon = float(experiment.protocol.get("horizon_steps", math.inf))
    out = []
    for data in runs:
        scalars = data.scalars or {}
        means = [(step, value) for step, value in scalars.get(metric_names.POLICY_LAG_MEAN, ()) if step <= horizon]
        maxima = [value for step, value in scalars.get(metric_names.POLICY_LAG_MAX, ()) if step <= horizon]
        out.append(LagRow(
            run_label=data.label, last_step=means[-1][0] if means else None,
            mean=fmean(value for _, value in means) if means else None, max=max(maxima) if maxima else None,
            paper=_paper_lag(paper, experiment, data.run),
        ))
    return out


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def markdown(experiment: Experiment, rows: list[LagRow]) -> list[str]:
    horizon = experiment.protocol.get("horizon_steps")
    steps = f"steps ≤ {horizon:,}" if horizon is not None else "all steps"
    lines = [f"Policy lag, `{experiment.name}` (updates; {steps}; flagged when more than {TOLERANCE:g} off the "
             "paper's):", "",
             "| run | lag mean | lag max | last step | paper | flag |", "|---|---|---|---|---|---|"]
    for row in rows:
        paper = "not stated" if row.paper is None or row.paper.value is None else f"{row.paper.value:g}"
        flag = "OFF THE PAPER'S LAG" if row.off else ""
        last = "—" if row.last_step is None else f"{row.last_step:,}"
        lines.append(f"| {row.run_label} | {_cell(row.mean)} | {_cell(row.max)} | {last} | {paper} | {flag} |")
    return lines
