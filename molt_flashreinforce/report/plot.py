"""Learning curves of runs with the paper's reported points overlaid.

Contract: `plot_runs(experiments, out_path)` draws one panel per plotted metric of each
experiment (`plot.metrics` in the paper results): one line per run against update step, or
against rollouts consumed for experiments whose `plot.x` is `rollouts`; a seed group
(paper_table.seed_groups) as its mean over seeds with the 95 % bootstrap band (statistics.py) at
the steps every seed logged; an eval directory as one point with its standard error; and the
paper's points for every arm that reports that metric at a known step (dashed, circles). Writes
a PNG with matplotlib's Agg backend (no display needed) and returns the path.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen before pyplot loads

from molt_flashreinforce.report.paper import Experiment, Metric, PaperResults  # noqa: E402
from molt_flashreinforce.report.paper_table import group_label, seed_groups, stderr_at  # noqa: E402
from molt_flashreinforce.report.protocol import metric_series, rollouts_at  # noqa: E402
from molt_flashreinforce.report.statistics import resample_indices  # noqa: E402
from molt_flashreinforce.report.table import RunData  # noqa: E402

MAX_COLUMNS = 3


def paper_points(paper: PaperResults, experiment: Experiment, metric_id: str) -> dict[str, list[tuple[float, float]]]:
    """{arm id: [(x, value), ...]} for the metric, primary sources first at each x."""
    rows = {row.id: row for row in experiment.rows}
    points: dict[str, dict[float, float]] = {}
    ordered = sorted(experiment.reported, key=paper.is_secondary)  # stable: primary before secondary
    for entry in ordered:
        if entry.value is None or entry.arm is None:
            continue
        row = rows.get(entry.row) if entry.row else None
        if (row.metric if row else entry.metric) != metric_id:
            continue
        # A row's protocol point is an x position only when it is on the plot's own axis.
        on_axis = row.at.bound if row is not None and row.at.selector == experiment.plot_x else None
        x = (entry.step if entry.step is not None else on_axis) if experiment.plot_x == "step" else on_axis
        if x is None or math.isinf(x):
            continue
        points.setdefault(entry.arm, {}).setdefault(x, entry.value)
    return {arm: sorted(by_x.items()) for arm, by_x in points.items()}


def _run_curve(data: RunData, series, x_axis: str) -> tuple[list[float], list[float]]:
    if x_axis == "step":
        return [step for step, _ in series], [value for _, value in series]
    xs, ys = [], []
    for step, value in series:
        consumed = rollouts_at(data.scalars, step)
        if consumed is not None:
            xs.append(consumed)
            ys.append(value)
    return xs, ys


def _draw_group(axis, group: list[RunData], metric: Metric, x_axis: str) -> bool:
    """A seed group's mean curve and 95 % band; False when its seeds share no logged step."""
    series = [dict(metric_series(data.scalars, metric) or ()) if data.scalars else {} for data in group]
    steps = sorted(set.intersection(*(set(by_step) for by_step in series)))
    if not steps:
        return False
    values = np.asarray([[by_step[step] for step in steps] for by_step in series])
    means = values[resample_indices(len(values))].mean(axis=1)
    xs, _ = _run_curve(group[0], [(step, 0.0) for step in steps], x_axis)
    if len(xs) != len(steps):
        return False
    axis.plot(xs, values.mean(axis=0), label=f"{group_label(group)}: mean, 95 % band")
    axis.fill_between(xs, np.percentile(means, 2.5, axis=0), np.percentile(means, 97.5, axis=0), alpha=0.2)
    return True


def _draw_eval(axis, data: RunData, metric: Metric, x_axis: str) -> bool:
    series = metric_series(data.scalars, metric) if data.scalars else None
    if not series or x_axis != "step":
        return False
    step, value = series[-1]
    stderr = stderr_at(data.scalars, metric, step)
    axis.errorbar([step], [value], yerr=[stderr] if stderr is not None else None, marker="s", linestyle="none",
                  capsize=3, label=f"eval: {data.record.model.path}")
    return True


def plot_runs(paper: PaperResults, experiments: list[tuple[Experiment, list[RunData]]], out_path: Path) -> Path:
    panels = [(experiment, runs, metric_id) for experiment, runs in experiments for metric_id in experiment.plot_metrics]
    columns = min(MAX_COLUMNS, len(panels))
    lines = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(lines, columns, figsize=(6 * columns, 4.2 * lines), squeeze=False)
    for axis, (experiment, runs, metric_id) in zip(axes.flat, panels):
        metric = experiment.metrics[metric_id]
        drawn = 0
        for data in runs:
            if data.record is not None:
                drawn += _draw_eval(axis, data, metric, experiment.plot_x)
        for group in seed_groups([data for data in runs if data.record is None]):
            if len(group) > 1:
                drawn += _draw_group(axis, group, metric, experiment.plot_x)
                continue
            data = group[0]
            series = metric_series(data.scalars, metric) if data.scalars else None
            if not series:
                continue
            xs, ys = _run_curve(data, series, experiment.plot_x)
            if xs:
                axis.plot(xs, ys, marker="." if len(xs) <= 40 else None, label=data.label)
                drawn += 1
        for arm_id, points in paper_points(paper, experiment, metric_id).items():
            axis.plot([x for x, _ in points], [y for _, y in points], linestyle="--", marker="o", markersize=5,
                      label=f"paper: {experiment.arms[arm_id].label}")
            drawn += 1
        if not drawn:
            axis.text(0.5, 0.5, "not in these runs", ha="center", va="center", transform=axis.transAxes)
        axis.set_title(f"{experiment.name}\n{metric.label}", fontsize=10)
        axis.set_xlabel("rollouts consumed" if experiment.plot_x == "rollouts" else "update step")
        axis.set_ylabel(metric.unit)
        axis.grid(alpha=0.3)
        if drawn:
            axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(panels):]:
        axis.set_visible(False)
    figure.tight_layout()
    figure.savefig(out_path, dpi=110)
    plt.close(figure)
    return out_path
