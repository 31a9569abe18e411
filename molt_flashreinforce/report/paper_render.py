"""Render the paper's tables (paper_table.py) as Markdown, CSV or LaTeX.

Contract: `render(tables, fmt)` with `fmt` one of table.FORMATS. A cell shows the value in the
paper's unit at the paper's precision (never fewer decimals than the metric asks for), then
`± se` for an eval's standard error or `[low, high]` for a seed group's 95 % interval; an
empty cell is `—`. Markdown adds, per experiment, the rollouts and GPU-hours to the target score,
what each grader is, and the notes (missing cells and why, points a run did not reach). CSV is
long: one row per line and column (experiments with different columns share one file), then
the target rows with `column` = `rollouts_to_target` and `gpu_hours_to_target`.
"""

from __future__ import annotations

import csv
import io
import math

from molt_flashreinforce.report.paper_table import Cell, Line, PaperTable, TargetLine
from molt_flashreinforce.report.provenance import GRADER_TEXT, UNKNOWN
from molt_flashreinforce.report.statistics import BOOTSTRAP
from molt_flashreinforce.report.table import latex_escape, md_escape

NO_VALUE = "—"
CELL_LEGEND = (f"A cell `v ± se` is an eval's avg@k with its standard error over problems; `v [low, high]` is the "
               f"mean over seeds with its 95 % bootstrap interval ({BOOTSTRAP:,} resamples of the seeds; with few "
               "seeds it is too narrow). `step` is the step each value was read at (the last eval at or before the "
               "point); rollouts and GPU-hours are what the run had spent by then.")
CSV_HEADER = ("experiment", "kind", "model", "point", "steps", "seeds", "column", "metric", "value", "stderr",
              "ci_low", "ci_high", "status", "rollouts", "gpu_hours", "grader", "protocol", "sources")


def _number(value: float | None, decimals: int) -> str:
    return NO_VALUE if value is None else f"{value:.{decimals}f}"


def _count(value: float | None) -> str:
    return NO_VALUE if value is None or math.isinf(value) else f"{value:,.0f}"


def _hours(value: float | None) -> str:
    return NO_VALUE if value is None else f"{value:,.2f}"


def cell_text(cell: Cell, decimals: int, plus_minus: str = "±") -> str:
    if cell.value is None:
        return NO_VALUE
    text = _number(cell.value, decimals)
    if cell.stderr is not None:
        text += f" {plus_minus} {_number(cell.stderr, decimals)}"
    if cell.ci95 is not None:
        text += f" [{_number(cell.ci95[0], decimals)}, {_number(cell.ci95[1], decimals)}]"
    return text


def _steps(line: Line) -> str:
    return ", ".join(f"{step:,}" for step in line.steps) or NO_VALUE


def _line_cells(table: PaperTable, line: Line, plus_minus: str = "±") -> list[str]:
    return [line.model, line.point, _steps(line),
            *(cell_text(cell, decimals, plus_minus) for cell, decimals in zip(line.cells, table.decimals)),
            _count(line.rollouts), _hours(line.gpu_hours), line.provenance.grader, line.provenance.protocol,
            line.sources if line.kind == "paper" else ""]


def _header(table: PaperTable) -> list[str]:
    return ["model", "point", "step", *(metric.column for metric in table.columns), "rollouts", "GPU-hours", "grader",
            "eval protocol", "source"]


def _interval(ci: tuple[float, float] | None, formatted) -> str:
    return "" if ci is None else f" [{formatted(ci[0])}, {formatted(ci[1])}]"


def _target_cells(line: TargetLine) -> list[str]:
    if line.missing:
        return [line.model, line.missing, NO_VALUE, NO_VALUE, line.note]
    return [line.model, _count(line.step), _count(line.rollouts) + _interval(line.rollouts_ci95, _count),
            _hours(line.gpu_hours) + _interval(line.gpu_hours_ci95, _hours), line.note]


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(md_escape(cell) for cell in row) + " |" for row in rows]


def markdown(table: PaperTable) -> str:
    experiment = table.experiment
    out = [f"### {experiment.title} (`{experiment.name}`): the paper's table", ""]
    out += _markdown_table(_header(table), [_line_cells(table, line) for line in table.lines])
    out += ["", CELL_LEGEND]
    if table.target_lines:
        metric = table.target_metric
        out += ["", f"Rollouts and GPU-hours to reach {metric.column} ≥ {table.target_value:g} {metric.unit} "
                    f"({metric.label}; target: {table.target_source}), at the first eval at or above it:", ""]
        out += _markdown_table(["model", "step", "rollouts", "GPU-hours", "note"],
                               [_target_cells(line) for line in table.target_lines])
    graders = [f"- {grader}: {GRADER_TEXT[grader]}" for grader in table.graders if grader in GRADER_TEXT]
    if UNKNOWN in table.graders:
        graders.append(f"- {UNKNOWN}: no source (record, config or paper) names the grader of those lines")
    notes = {line.provenance.note for line in table.lines if line.kind == "paper" and line.provenance.note}
    if graders:
        out += ["", "Graders:"] + graders + [f"- the paper's grader: {note}" for note in sorted(notes)]
    if table.notes:
        out += ["", "Missing:"] + list(table.notes)
    return "\n".join(out) + "\n"


def _csv_rows(table: PaperTable) -> list[tuple]:
    rows = []
    name = table.experiment.name
    for line in table.lines:
        for metric, cell in zip(table.columns, line.cells):
            rows.append((name, line.kind, line.model, line.point, " ".join(map(str, line.steps)), line.seeds,
                         metric.id, metric.label, _blank(cell.value), _blank(cell.stderr),
                         _blank(cell.ci95 and cell.ci95[0]), _blank(cell.ci95 and cell.ci95[1]), cell.missing or "",
                         _blank(line.rollouts), _blank(line.gpu_hours), line.provenance.grader,
                         line.provenance.protocol, line.sources))
    for target in table.target_lines:
        point = f"first eval with {table.target_metric.id} >= {table.target_value:g}"
        for column, value, ci in (("rollouts_to_target", target.rollouts, target.rollouts_ci95),
                                  ("gpu_hours_to_target", target.gpu_hours, target.gpu_hours_ci95)):
            rows.append((name, target.kind, target.model, point, _blank(target.step), "", column, table.target_source,
                         _blank(value), "", _blank(ci and ci[0]), _blank(ci and ci[1]), target.missing or target.note,
                         "", "", "", "", ""))
    return rows


def _blank(value) -> object:
    return "" if value is None else value


def _latex(table: PaperTable) -> str:
    experiment = table.experiment
    header = _header(table)[:-1]  # sources stay in the Markdown and CSV
    lines = [f"% {experiment.title} ({experiment.name}): the paper's table; needs \\usepackage{{booktabs}}",
             r"\begin{tabular}{lll" + "r" * (len(table.columns) + 2) + "ll}", r"\toprule",
             " & ".join(latex_escape(cell) for cell in header) + r" \\", r"\midrule"]
    for line in table.lines:
        cells = _line_cells(table, line, plus_minus="±")[:-1]
        lines.append(" & ".join(latex_escape(cell).replace("±", r"$\pm$") for cell in cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def render(tables: list[PaperTable], fmt: str) -> str:
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(CSV_HEADER)
        for table in tables:
            writer.writerows(_csv_rows(table))
        return buffer.getvalue()
    if fmt == "md":
        return "\n".join(markdown(table) for table in tables)
    if fmt == "latex":
        return "\n".join(_latex(table) for table in tables)
    raise ValueError(f"unknown format {fmt!r}")
