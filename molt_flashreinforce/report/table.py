"""Build the paper-vs-run comparison table and render it as Markdown, CSV or LaTeX.

Contract: `build_rows(paper, experiment, runs)` takes `RunData` (a run, its label and its
scalars, or why it has none) and returns one `TableRow` per (run, table row of the
experiment), runs in the given order: paper | this run | difference, plus the step actually
used and the rollouts consumed by then. `render(tables, fmt, paper)` prints one table per
experiment; `fmt` is one of `FORMATS`.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

from molt_flashreinforce.report.events import Series
from molt_flashreinforce.report.paper import Experiment, PaperResults, Reported
from molt_flashreinforce.report.protocol import NOT_IN_RUN, Measurement, match_arm, measure, paper_value
from molt_flashreinforce.report.runs import Run

FORMATS = ("md", "csv", "latex")
NO_VALUE = "—"
HEADER = ("run", "measure", "protocol", "step used", "rollouts", "paper", "this run", "run − paper", "paper arm", "source")


@dataclass(frozen=True)
class RunData:
    run: Run
    label: str
    scalars: dict[str, Series] | None  # None: no event files (detail in `unreadable`)
    unreadable: str | None = None


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
            else:
                measurement = measure(data.scalars, metric, row.at)
            reported = paper_value(paper, experiment, row, arm)
            decimals = metric.decimals if reported is None else max(metric.decimals, _decimals_of(reported.value))
            rows.append(TableRow(
                experiment=experiment.name, run_label=data.label, run_dir=str(data.run.path), row_id=row.id,
                measure=metric.label, protocol=row.at.describe(), measurement=measurement, paper=reported,
                arm_label=arm_label, decimals=decimals,
                secondary=reported is not None and paper.is_secondary(reported),
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
        row.run_label, row.measure, row.protocol, _count(m.step), _count(m.rollouts), paper,
        m.missing if m.value is None else _number(m.value, row.decimals),
        _number(row.difference, row.decimals, signed=True), row.arm_label, sources,
    )


def _md_escape(cell: str) -> str:
    return cell.replace("|", "\\|")


def _markdown(paper: PaperResults, experiment: Experiment, rows: list[TableRow]) -> str:
    lines = [f"### {experiment.title} (`{experiment.name}`)", "", f"Protocol: {experiment.protocol['summary']}", ""]
    lines.append("| " + " | ".join(HEADER) + " |")
    lines.append("|" + "|".join("---" for _ in HEADER) + "|")
    lines += ["| " + " | ".join(_md_escape(cell) for cell in _display_cells(row)) + " |" for row in rows]
    used_tags = sorted({tag for row in rows if row.paper for tag in row.paper.sources})
    if used_tags:
        lines.append("")
        lines.append("Sources: " + "; ".join(
            f"[{tag}] {paper.sources[tag].what} ({paper.sources[tag].kind})" for tag in used_tags) + ".")
    missing = [row for row in rows if row.measurement.value is None and row.measurement.detail]
    if missing:
        lines.append("")
        lines += [f"- {row.run_label}, {row.measure} ({row.protocol}): {row.measurement.missing}: "
                  f"{row.measurement.detail}" for row in missing]
    return "\n".join(lines) + "\n"


CSV_HEADER = ("experiment", "run", "run_dir", "row", "measure", "protocol", "step_used", "rollouts",
              "paper", "paper_step", "this_run", "difference", "status", "paper_arm", "sources", "provenance")


def _csv_rows(rows: list[TableRow]) -> list[tuple]:
    out = []
    for row in rows:
        m = row.measurement
        provenance = "" if row.paper is None else ("secondary" if row.secondary else "primary")
        status = "" if m.value is not None else f"{m.missing}: {m.detail}" if m.detail else m.missing
        out.append((
            row.experiment, row.run_label, row.run_dir, row.row_id, row.measure, row.protocol,
            "" if m.step is None else m.step, "" if m.rollouts is None else m.rollouts,
            "" if row.paper is None or row.paper.value is None else row.paper.value,
            "" if row.paper is None or row.paper.step is None else row.paper.step,
            "" if m.value is None else m.value, "" if row.difference is None else row.difference,
            status, row.arm_label, " ".join(row.paper.sources) if row.paper else "", provenance,
        ))
    return out


_LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                   "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                   "−": "$-$", "—": "---", "≤": r"$\le$"}


def _latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIALS.get(char, char) for char in text)


def _latex(experiment: Experiment, rows: list[TableRow]) -> str:
    lines = [
        f"% {experiment.title} ({experiment.name}); needs \\usepackage{{booktabs}}",
        r"\begin{tabular}{lllrrrrrll}",  # text | step, rollouts, paper, run, difference | arm, source
        r"\toprule",
        " & ".join(_latex_escape(cell) for cell in HEADER) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(_latex_escape(cell) for cell in _display_cells(row)) + r" \\" for row in rows]
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
