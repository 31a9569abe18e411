"""The paper's own table for an experiment: its columns, one line per model at each protocol point.

Contract: `build(paper, experiment, runs, target=None) -> PaperTable` for an experiment with a
`layout` (paper.Layout). Lines, point by point in the layout's order:

* the paper's numbers of every arm that has one at that point (`paper` lines; a curve point of
  the paper counts at its step);
* each run or seed group (`run` / `seeds` lines): runs whose configs differ only in `seed` form
  one group, shown as the mean over seeds with a 95 % bootstrap interval (statistics.py). A
  point the run did not reach (its last logged step, or its rollouts, short of the point) gives
  no line but a note; step 0 is the base model, as each run evaluated it before training;
* each eval directory (`eval` lines, eval_record.py) at the point of its own step, with each
  number's standard error (the `_stderr` tags; the mean of k benchmarks has
  sqrt(sum se^2) / k); an eval at a step no point names gets a point of its own.

Every line names its grader and eval protocol (provenance.py). A run's cell is measured as in
protocol.py (the last value at or before the point); a cell a run lacks says why in `notes`.
`target_lines` give, per run or group, the first eval at or above the target score (default:
the paper's number for the layout's target row) with the rollouts and GPU-hours spent by then.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from statistics import fmean

from molt_flashreinforce import metrics as metric_names
from molt_flashreinforce.eval_record import EvalRecord
from molt_flashreinforce.report.cost import cost_at
from molt_flashreinforce.report.paper import At, Experiment, Metric, PaperResults, Reported
from molt_flashreinforce.report.protocol import NOT_IN_RUN, measure, metric_series, paper_value, rollouts_at
from molt_flashreinforce.report.provenance import Provenance, of_paper, of_run
from molt_flashreinforce.report.runs import identity
from molt_flashreinforce.report.statistics import mean_ci
from molt_flashreinforce.report.table import RunData

# Eval records keep these per-benchmark means of the agents' info; a training run logs them as tags.
RECORD_MEANS = {metric_names.TOOL_CALLS: "tool_calls_mean", metric_names.TURNS: "turns_mean"}


@dataclass(frozen=True)
class Cell:
    value: float | None
    stderr: float | None = None  # an eval's standard error
    ci95: tuple[float, float] | None = None  # a seed group's interval of the mean
    missing: str | None = None  # why value is None


@dataclass(frozen=True)
class Line:
    kind: str  # "paper", "run", "seeds" or "eval"
    model: str
    point: str
    cells: tuple[Cell, ...]
    provenance: Provenance
    steps: tuple[int, ...] = ()  # steps the cells were read at (the paper's own step for a paper line)
    rollouts: float | None = None
    gpu_hours: float | None = None
    seeds: int = 1
    sources: str = ""  # the paper's source tags, or the run directories


@dataclass(frozen=True)
class TargetLine:
    model: str
    kind: str  # "paper", "run" or "seeds"
    step: int | None
    rollouts: float | None
    rollouts_ci95: tuple[float, float] | None = None
    gpu_hours: float | None = None
    gpu_hours_ci95: tuple[float, float] | None = None
    missing: str | None = None  # why there is no crossing
    note: str = ""


@dataclass(frozen=True)
class PaperTable:
    experiment: Experiment
    columns: tuple[Metric, ...]
    decimals: tuple[int, ...]
    lines: tuple[Line, ...]
    notes: tuple[str, ...]
    target_metric: Metric | None = None
    target_value: float | None = None
    target_source: str = ""
    target_lines: tuple[TargetLine, ...] = ()
    graders: tuple[str, ...] = field(default_factory=tuple)

    @property
    def measured(self) -> bool:
        """Some cell of a run or an eval was filled."""
        return any(cell.value is not None for line in self.lines if line.kind != "paper" for cell in line.cells)


def describe_point(at: At) -> str:
    if at.selector == "step" and at.bound == 0:
        return "step 0 (base model)"
    return at.describe()


def _same_point(a: At, b: At) -> bool:
    return a.selector == b.selector and a.bound == b.bound


def _decimals_of(value: float | None) -> int:
    text = repr(value)
    return len(text.split(".")[1]) if value is not None and "." in text and "e" not in text else 0


# ── the paper's lines ──

def _paper_entry(experiment: Experiment, paper: PaperResults, arm_id: str, metric_id: str, point: At) -> Reported | None:
    rows = {row.id: row for row in experiment.rows}
    candidates = [entry for entry in experiment.reported if entry.arm == arm_id and entry.value is not None and (
        (entry.row and rows[entry.row].metric == metric_id and _same_point(rows[entry.row].at, point))
        or (entry.metric == metric_id and point.selector == "step" and entry.step == point.bound))]
    primary = [entry for entry in candidates if not paper.is_secondary(entry)]
    return (primary or candidates or [None])[0]


def _paper_lines(paper: PaperResults, experiment: Experiment, columns: tuple[Metric, ...], point: At) -> list[Line]:
    lines = []
    for arm in experiment.arms.values():
        entries = [_paper_entry(experiment, paper, arm.id, metric.id, point) for metric in columns]
        if not any(entries):
            continue
        cells = tuple(Cell(entry.value) if entry else Cell(None, missing="not reported") for entry in entries)
        steps = sorted({int(entry.step) for entry in entries if entry and entry.step is not None})
        tags = dict.fromkeys(tag for entry in entries if entry for tag in entry.sources)
        secondary = all(paper.is_secondary(entry) for entry in entries if entry)
        lines.append(Line("paper", f"paper: {arm.label}", describe_point(point), cells, of_paper(experiment),
                          steps=tuple(steps), sources=" ".join(f"[{tag}]" for tag in tags) + (" secondary" if secondary else "")))
    return lines


# ── runs, seed groups and evals ──

def _config_without_seed(data: RunData) -> str | None:
    if data.run.config is None or data.record is not None:
        return None
    return json.dumps({key: value for key, value in data.run.config.items() if key != "seed"}, sort_keys=True, default=str)


def seed_groups(runs: list[RunData]) -> list[list[RunData]]:
    """Runs in command-line order, those whose configs differ only in `seed` together (training runs only)."""
    groups: dict[object, list[RunData]] = {}
    for index, data in enumerate(runs):
        key = _config_without_seed(data)
        groups.setdefault(index if key is None else key, []).append(data)
    return list(groups.values())


def group_label(group: list[RunData]) -> str:
    if len(group) == 1:
        return group[0].label
    kept = [token for token in group[0].label.split() if not token.startswith("seed=")]
    seeds = ", ".join(str(data.run.get("seed")) for data in group)
    return f"{' '.join(kept) or ' '.join(identity(group[0].run))} (seeds {seeds})"


def _last_step(data: RunData) -> int:
    return max((step for series in (data.scalars or {}).values() for step, _ in series), default=-1)


def reached(data: RunData, point: At) -> bool:
    """Whether the run went as far as the point (step 0 and `final` always)."""
    if math.isinf(point.bound) or point.bound == 0:
        return True
    if point.selector == "rollouts":
        consumed = (data.scalars or {}).get(metric_names.ROLLOUTS_CONSUMED, ())
        return bool(consumed) and consumed[-1][1] >= point.bound
    return _last_step(data) >= point.bound


def stderr_at(scalars, metric: Metric, step: int) -> float | None:
    if not metric.datasources:
        return None
    errors = []
    for datasource in metric.datasources:
        by_step = dict(scalars.get(metric_names.eval_pass1_stderr(datasource), ()))
        if step not in by_step:
            return None
        errors.append(by_step[step])
    return math.sqrt(sum(error * error for error in errors)) / len(errors) * metric.scale


def _record_mean(record: EvalRecord, metric: Metric) -> Cell | None:
    """A per-benchmark mean the eval record keeps (tool calls, turns), weighted by samples."""
    tags = metric.alternatives[0].tags
    if len(tags) != 1 or tags[0] not in RECORD_MEANS:
        return None
    key = RECORD_MEANS[tags[0]]
    pairs = [(getattr(score, key), score.samples) for score in record.benchmarks.values() if getattr(score, key) is not None]
    if not pairs:
        return Cell(None, missing=f"not in this eval: no {key} in its eval.json")
    return Cell(sum(value * samples for value, samples in pairs) / sum(samples for _, samples in pairs) * metric.scale)


def _run_cell(data: RunData, metric: Metric, point: At) -> tuple[Cell, int | None, str | None]:
    """(cell, step read, why it is missing with detail)."""
    if data.scalars is None:
        return Cell(None, missing=NOT_IN_RUN), None, data.unreadable
    if data.record is not None:
        from_record = _record_mean(data.record, metric)
        if from_record is not None:
            return from_record, data.record.model.step if from_record.value is not None else None, None
    measured = measure(data.scalars, metric, point)
    if measured.value is None:
        return Cell(None, missing=measured.missing), None, measured.detail
    return Cell(measured.value, stderr=stderr_at(data.scalars, metric, measured.step)), measured.step, None


def _run_line(data: RunData, columns, point: At, kind: str, notes: list[str]) -> Line:
    cells, steps = [], set()
    for metric in columns:
        cell, step, detail = _run_cell(data, metric, point)
        cells.append(cell)
        if step is not None:
            steps.add(step)
        elif cell.missing:
            notes.append(f"- {data.label}, {describe_point(point)}, {metric.column}: {cell.missing}"
                         + (f": {detail}" if detail else ""))
    step = max(steps) if steps else None
    rollouts = gpu_hours = None
    if step is not None and data.scalars is not None and data.record is None:
        rollouts = 0.0 if step == 0 else rollouts_at(data.scalars, step)
        gpu_hours = cost_at(data.scalars, data.placement, step).gpu_hours
    return Line(kind, data.label, describe_point(point), tuple(cells), of_run(data.run, data.record),
                steps=tuple(sorted(steps)), rollouts=rollouts, gpu_hours=gpu_hours, sources=str(data.run.path))


def _group_line(group: list[RunData], columns, point: At, notes: list[str]) -> Line:
    single_notes: list[list[str]] = [[] for _ in group]
    singles = [_run_line(data, columns, point, "run", notes_of) for data, notes_of in zip(group, single_notes)]
    cells = []
    for index, metric in enumerate(columns):
        values = [line.cells[index].value for line in singles]
        if any(value is None for value in values):
            have = sum(value is not None for value in values)
            first = next(line.cells[index] for line in singles if line.cells[index].value is None)
            reason = f"{have} of {len(values)} seeds have it ({first.missing})"
            cells.append(Cell(None, missing=reason))
            notes.append(f"- {group_label(group)}, {describe_point(point)}, {metric.column}: {reason}")
            continue
        summary = mean_ci(values)
        cells.append(Cell(summary["mean"], ci95=tuple(summary["ci95"])))
    mean_of = lambda values: fmean(values) if values and None not in values else None  # noqa: E731
    return Line("seeds", group_label(group), describe_point(point), tuple(cells), singles[0].provenance,
                steps=tuple(sorted({step for line in singles for step in line.steps})),
                rollouts=mean_of([line.rollouts for line in singles]), gpu_hours=mean_of([line.gpu_hours for line in singles]),
                seeds=len(group), sources=" ".join(str(data.run.path) for data in group))


def _eval_model(record: EvalRecord) -> str:
    what = {"hf_id": "Hugging Face model", "hf_dir": "HF export", "molt_checkpoint": "Molt checkpoint"}
    return f"eval: {what.get(record.model.kind, record.model.kind)} {record.model.path}"


# ── rollouts and GPU-hours to reach the target ──

def _crossing(data: RunData, metric: Metric, target: float) -> tuple[int | None, str | None]:
    series = metric_series(data.scalars or {}, metric)
    if not series:
        return None, f"{NOT_IN_RUN}: {', '.join(metric.alternatives[0].tags)}"
    for step, value in series:
        if value >= target:
            return step, None
    return None, f"never reached (best {max(value for _, value in series):.{metric.decimals}f} by step {series[-1][0]:,})"


def _target_line(group: list[RunData], metric: Metric, target: float) -> TargetLine:
    crossings = []
    for data in group:
        step, missing = _crossing(data, metric, target)
        if step is None:
            crossings.append((None, None, None, missing))
            continue
        rollouts = rollouts_at(data.scalars, step)
        cost = cost_at(data.scalars, data.placement, step)
        crossings.append((step, rollouts, cost.gpu_hours, None))
    label, kind = group_label(group), "seeds" if len(group) > 1 else "run"
    if len(group) == 1:
        step, rollouts, gpu_hours, missing = crossings[0]
        return TargetLine(label, kind, step, rollouts, gpu_hours=gpu_hours, missing=missing)
    reached_by = [c for c in crossings if c[0] is not None]
    if len(reached_by) < len(group):
        return TargetLine(label, kind, None, None, missing=f"reached by {len(reached_by)} of {len(group)} seeds")
    rollouts = [c[1] for c in reached_by]
    gpu_hours = [c[2] for c in reached_by]
    r_ci = mean_ci(rollouts) if None not in rollouts else None
    g_ci = mean_ci(gpu_hours) if None not in gpu_hours else None
    return TargetLine(label, kind, max(c[0] for c in reached_by), r_ci["mean"] if r_ci else None,
                      tuple(r_ci["ci95"]) if r_ci else None, g_ci["mean"] if g_ci else None,
                      tuple(g_ci["ci95"]) if g_ci else None)


def _paper_target(paper: PaperResults, experiment: Experiment) -> tuple[Metric, Reported] | None:
    row = next(row for row in experiment.rows if row.id == experiment.layout.target)
    entry = paper_value(paper, experiment, row, experiment.arms[experiment.default_arm])
    if entry is None or entry.value is None:
        return None
    return experiment.metrics[row.metric], entry


def _paper_target_line(experiment: Experiment, entry: Reported) -> TargetLine:
    row = next(row for row in experiment.rows if row.id == experiment.layout.target)
    batch = experiment.protocol.get("batch")
    label = f"paper: {experiment.arms[experiment.default_arm].label}"
    if row.at.selector == "rollouts":
        return TargetLine(label, "paper", int(entry.step) if entry.step is not None else None, row.at.bound,
                          note="the paper's budget; GPU-hours not reported")
    step = entry.step if entry.step is not None else row.at.bound
    rollouts = step * batch if batch and not math.isinf(step) else None
    return TargetLine(label, "paper", int(step), rollouts,
                      note=f"rollouts = step x {batch} per update; GPU-hours not reported" if rollouts else
                      "GPU-hours not reported")


# ── the table ──

def build(paper: PaperResults, experiment: Experiment, runs: list[RunData], target: float | None = None) -> PaperTable:
    layout = experiment.layout
    columns = tuple(experiment.metrics[metric_id] for metric_id in layout.columns)
    trainings = [data for data in runs if data.record is None]
    evals = [data for data in runs if data.record is not None]
    groups = seed_groups(trainings)
    points = list(layout.points)
    for data in evals:  # an eval at a step no point names gets its own point
        step = data.record.model.step
        if not any(point.selector == "step" and point.bound == step for point in points):
            points.append(At("step", float(step)))
    lines: list[Line] = []
    notes: list[str] = []
    for point in points:
        lines += _paper_lines(paper, experiment, columns, point)
        for group in groups:
            short = [data for data in group if not reached(data, point)]
            if short:
                ends = ", ".join(f"step {_last_step(data):,}" for data in short)
                notes.append(f"- {group_label(group)}: {describe_point(point)} not reached (the run ends at {ends})")
                continue
            lines.append(_run_line(group[0], columns, point, "run", notes) if len(group) == 1
                         else _group_line(group, columns, point, notes))
        for data in evals:
            if point.selector == "step" and point.bound == data.record.model.step:
                line = _run_line(data, columns, point, "eval", notes)
                lines.append(Line(line.kind, f"{_eval_model(data.record)} ({data.label})", line.point, line.cells,
                                  line.provenance, line.steps, sources=line.sources))
    decimals = tuple(max([metric.decimals] + [_decimals_of(line.cells[i].value) for line in lines if line.kind == "paper"])
                     for i, metric in enumerate(columns))
    graders = tuple(dict.fromkeys(line.provenance.grader for line in lines))
    table = PaperTable(experiment, columns, decimals, tuple(lines), tuple(notes), graders=graders)
    return _with_target(paper, table, groups, target)


def _with_target(paper: PaperResults, table: PaperTable, groups: list[list[RunData]], target: float | None) -> PaperTable:
    experiment = table.experiment
    if experiment.layout.target is None and target is None:
        return table
    paper_target = _paper_target(paper, experiment) if experiment.layout.target else None
    metric = paper_target[0] if paper_target else table.columns[-1]
    lines = []
    if target is None:
        if paper_target is None:
            return table
        target, source = paper_target[1].value, "the paper's number " + " ".join(f"[{t}]" for t in paper_target[1].sources)
        lines.append(_paper_target_line(experiment, paper_target[1]))
    else:
        source = "--target"
    lines += [_target_line(group, metric, target) for group in groups]
    return PaperTable(experiment, table.columns, table.decimals, table.lines, table.notes, metric, target, source,
                      tuple(lines), table.graders)
