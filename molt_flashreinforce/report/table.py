"""Build the paper-vs-run comparison table and render it as Markdown, CSV or LaTeX.

Contract: `build_rows(paper, experiment, runs)` takes `RunData` (a run, its label, its
scalars or why it has none, the GPUs it held, and for an eval directory its `EvalRecord`) and
returns one `TableRow` per (run, table row of the experiment), runs in the given order: paper |
this run | difference, plus the step actually used and what the run had spent by then
(rollouts, wall-clock, GPU-hours, generated and trained tokens; see `cost.py`). An eval
directory fills only the rows read at exactly its evaluated step (any other row would show the
one checkpoint's score as if measured elsewhere). `render(tables, fmt, paper)` prints one table
per experiment; `fmt` is one of `FORMATS`. A cost the run cannot give shows `n/a`; a row
without a step used has no cost (`—`).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

from molt_flashreinforce import metrics as metric_names
from molt_flashreinforce.eval_record import EvalRecord
from molt_flashreinforce.report.cost import Cost, cost_at
from molt_flashreinforce.report.events import Series
from molt_flashreinforce.report.paper import Experiment, PaperResults, Reported
from molt_flashreinforce.report.placement import Placement
from molt_flashreinforce.report.protocol import NOT_IN_RUN, Measurement, match_arm, measure, paper_value
from molt_flashreinforce.report.runs import Run

FORMATS = ("md", "csv", "latex")
NO_VALUE = "—"
NOT_AVAILABLE = "n/a"
HEADER = ("run", "measure", "protocol", "step used", "rollouts", "wall-clock", "GPU-hours", "generated tokens",
          "trained tokens", "paper", "this run", "run − paper", "paper arm", "source")
COST_NOTE = ("Cost is what the run had spent by the end of the step used: wall-clock sums the training steps' "
             f"{metric_names.STEP_TIME} (no start-up, no evals), GPU-hours = GPUs held x wall-clock, generated tokens "
             "are the sampled response tokens, trained tokens the prompt + response tokens trained on.")


@dataclass(frozen=True)
class RunData:
    run: Run
    label: str
    scalars: dict[str, Series] | None  # None: no event files (detail in `unreadable`)
    placement: Placement
    unreadable: str | None = None
    record: EvalRecord | None = None  # an eval directory's eval.json


@dataclass(frozen=True)
class TableRow:
    experiment: str
    run_label: str
    run_dir: str
    row_id: str
    measure: str
    protocol: str
    measurement: Measurement
    paper: Reported | None
    arm_label: str
    decimals: int
    secondary: bool
    cost: Cost | None  # None: no step used to cost
    placement: Placement

    @property
    def difference(self) -> float | None:
        if self.paper is None or self.paper.value is None or self.measurement.value is None:
            return None
        return self.measurement.value - self.paper.value


def build_rows(paper: PaperResults, experiment: Experiment, runs: list[RunData]) -> list[TableRow]:
    rows = []
    for data in runs:
        arm, assumed = match_arm(experiment, data.run)
        if arm is None:
            arm_label = "no paper arm matches this config"
        else:
            arm_label = arm.label + (" (assumed: run has no .hydra/config.yaml)" if assumed else "")
        for row in experiment.rows:
            metric = experiment.metrics[row.metric]
            if data.scalars is None:
                measurement = Measurement(None, None, missing=NOT_IN_RUN, detail=data.unreadable)
            elif data.record is not None and not (row.at.selector == "step" and row.at.bound == data.record.model.step):
                measurement = Measurement(None, None, missing="not this eval's point",
                                          detail=f"an evaluation of step {data.record.model.step} only")
            else:
                measurement = measure(data.scalars, metric, row.at)
            cost = None if measurement.step is None or data.record is not None else cost_at(
                data.scalars, data.placement, measurement.step)
            reported = paper_value(paper, experiment, row, arm)
            decimals = metric.decimals if reported is None else max(metric.decimals, _decimals_of(reported.value))
            rows.append(TableRow(
                experiment=experiment.name, run_label=data.label, run_dir=str(data.run.path), row_id=row.id,
                measure=metric.label, protocol=row.at.describe(), measurement=measurement, paper=reported,
                arm_label=arm_label, decimals=decimals,
                secondary=reported is not None and paper.is_secondary(reported), cost=cost, placement=data.placement,
            ))
    return rows


def _decimals_of(value: float | None) -> int:
    """Decimals the paper printed (25.73 -> 2), so the run is shown at the paper's precision."""
    text = repr(value)
    return len(text.split(".")[1]) if value is not None and "." in text and "e" not in text else 0


def _number(value: float | None, decimals: int, signed: bool = False) -> str:
    if value is None:
        return NO_VALUE
    return f"{value:+.{decimals}f}" if signed else f"{value:.{decimals}f}"


def _count(value: float | None) -> str:
    if value is None or math.isinf(value):
        return NO_VALUE
    return f"{value:,.0f}"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"  # a CPU update takes well under a second
    minutes, whole = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {whole:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours:,} h {minutes:02d} min"


def _cost_cells(cost: Cost | None) -> tuple[str, ...]:
    if cost is None:
        return (NO_VALUE,) * 4
    shown = (
        (cost.wall_s, _duration), (cost.gpu_hours, lambda hours: f"{hours:,.2f}"),
        (cost.generated_tokens, _count), (cost.trained_tokens, _count),
    )
    return tuple(NOT_AVAILABLE if value is None else formatted(value) for value, formatted in shown)


def _display_cells(row: TableRow) -> tuple[str, ...]:
    m = row.measurement
    paper = NO_VALUE
    if row.paper is not None:
        paper = _number(row.paper.value, row.decimals)
        if row.paper.step is not None:
            paper += f" (step {_count(row.paper.step)})"
    sources = NO_VALUE
    if row.paper is not None:
        sources = " ".join(f"[{tag}]" for tag in row.paper.sources) + (" secondary" if row.secondary else "")
    return (
        row.run_label, row.measure, row.protocol, _count(m.step), _count(m.rollouts), *_cost_cells(row.cost), paper,
        m.missing if m.value is None else _number(m.value, row.decimals),
        _number(row.difference, row.decimals, signed=True), row.arm_label, sources,
    )


def md_escape(cell: str) -> str:
    return cell.replace("|", "\\|")


def _markdown(paper: PaperResults, experiment: Experiment, rows: list[TableRow]) -> str:
    lines = [f"### {experiment.title} (`{experiment.name}`)", "", f"Protocol: {experiment.protocol['summary']}", ""]
    lines.append("| " + " | ".join(HEADER) + " |")
    lines.append("|" + "|".join("---" for _ in HEADER) + "|")
    lines += ["| " + " | ".join(md_escape(cell) for cell in _display_cells(row)) + " |" for row in rows]
    used_tags = sorted({tag for row in rows if row.paper for tag in row.paper.sources})
    if used_tags:
        lines.append("")
        lines.append("Sources: " + "; ".join(
            f"[{tag}] {paper.sources[tag].what} ({paper.sources[tag].kind})" for tag in used_tags) + ".")
    lines += ["", COST_NOTE]
    missing = [row for row in rows if row.measurement.value is None and row.measurement.detail]
    if missing:
        lines.append("")
        lines += [f"- {row.run_label}, {row.measure} ({row.protocol}): {row.measurement.missing}: "
                  f"{row.measurement.detail}" for row in missing]
    cost_notes = _cost_notes(rows)
    if cost_notes:
        lines.append("")
        lines += cost_notes
    return "\n".join(lines) + "\n"


def _cost_notes(rows: list[TableRow]) -> list[str]:
    """Per run: the GPUs its GPU-hours count, and why any of its cost cells is n/a."""
    notes = []
    for label in dict.fromkeys(row.run_label for row in rows):
        of_run = [row for row in rows if row.run_label == label]
        if of_run[0].placement.gpus is not None:
            notes.append(f"- {label}, GPUs held: {of_run[0].placement.describe}")
        reasons = dict.fromkeys(reason for row in of_run if row.cost for reason in row.cost.missing)
        if reasons:
            notes.append(f"- {label}, cost {NOT_AVAILABLE}: " + "; ".join(reasons))
    return notes


CSV_HEADER = ("experiment", "run", "run_dir", "row", "measure", "protocol", "step_used", "rollouts",
              "wall_s", "gpus", "gpu_hours", "generated_tokens", "trained_tokens",
              "paper", "paper_step", "this_run", "difference", "status", "cost_status", "paper_arm", "sources",
              "provenance")


def _csv_rows(rows: list[TableRow]) -> list[tuple]:
    out = []
    for row in rows:
        m = row.measurement
        provenance = "" if row.paper is None else ("secondary" if row.secondary else "primary")
        status = "" if m.value is not None else f"{m.missing}: {m.detail}" if m.detail else m.missing
        cost = row.cost or Cost(None, None, None, None)
        out.append((
            row.experiment, row.run_label, row.run_dir, row.row_id, row.measure, row.protocol,
            "" if m.step is None else m.step, "" if m.rollouts is None else m.rollouts,
            *("" if value is None else value for value in (
                cost.wall_s, row.placement.gpus, cost.gpu_hours, cost.generated_tokens, cost.trained_tokens)),
            "" if row.paper is None or row.paper.value is None else row.paper.value,
            "" if row.paper is None or row.paper.step is None else row.paper.step,
            "" if m.value is None else m.value, "" if row.difference is None else row.difference,
            status, "; ".join(cost.missing), row.arm_label, " ".join(row.paper.sources) if row.paper else "",
            provenance,
        ))
    return out


_LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                   "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                   "−": "$-$", "—": "---", "≤": r"$\le$"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIALS.get(char, char) for char in text)


def _latex(experiment: Experiment, rows: list[TableRow]) -> str:
    lines = [
        f"% {experiment.title} ({experiment.name}); needs \\usepackage{{booktabs}}",
        # text | step, rollouts, the four costs, paper, run, difference | arm, source
        r"\begin{tabular}{lllrrrrrrrrrll}",
        r"\toprule",
        " & ".join(latex_escape(cell) for cell in HEADER) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(latex_escape(cell) for cell in _display_cells(row)) + r" \\" for row in rows]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def render(tables: list[tuple[Experiment, list[TableRow]]], fmt: str, paper: PaperResults) -> str:
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(CSV_HEADER)
        for _, rows in tables:
            writer.writerows(_csv_rows(rows))
        return buffer.getvalue()
    if fmt == "md":
        return "\n".join(_markdown(paper, experiment, rows) for experiment, rows in tables)
    if fmt == "latex":
        return "\n".join(_latex(experiment, rows) for experiment, rows in tables)
    raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
