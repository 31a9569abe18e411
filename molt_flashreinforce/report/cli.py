"""`molt-flashreinforce-report`: put runs and evaluations beside the paper's reported numbers.

    molt-flashreinforce-report RUN_DIR... [--experiment NAME] [--view paper|compare]
        [--format md|csv|latex] [--target SCORE] [--plot FILE.png]

Each RUN_DIR is a Hydra run directory (or a multirun sweep directory, which expands to its
jobs) whose TensorBoard event files were written by Molt or by the local backend, or an eval
directory (`eval.json`, eval_record.py), which is a run to the report. Runs are grouped by
experiment (`--experiment`, else the one recorded in the run's Hydra config or eval record).

Two views (`--view`):
* `paper` (default): per experiment the paper's own table (paper_table.py): its columns at its
  protocol points, the paper's lines, each run or seed group (mean with a 95 % interval), each
  eval with standard errors, the grader and eval protocol of every line, and the rollouts and
  GPU-hours to reach the target score (`--target`, default the paper's number). In Markdown the
  compare view and the policy-lag block follow it.
* `compare`: paper | this run | difference, one block of rows per run, with what the run had
  spent by the step used (rollouts, wall-clock, GPU-hours, tokens); Markdown then lists each
  run's measured policy lag beside the paper's (`lag.py`).

Exit status: 0 when every table has a measured cell; 1 when some table has none (it names the
tags it looked for and the closest eval tags the runs have); 2 on bad input (with a message that
says what to fix).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from molt_flashreinforce.eval_record import EvalRecordError, read_record
from molt_flashreinforce.report import lag, paper_render, paper_table
from molt_flashreinforce.report.events import NoEventFilesError, read_scalars
from molt_flashreinforce.report.paper import DEFAULT_PATH, Experiment, PaperResults, PaperResultsError, load_paper_results
from molt_flashreinforce.report.placement import read_placement
from molt_flashreinforce.report.runs import RunDirError, expand_run_dirs, load_run, row_labels
from molt_flashreinforce.report.table import FORMATS, RunData, build_rows, render

PROG = "molt-flashreinforce-report"
VIEWS = ("paper", "compare")
EVAL_TAG_PREFIX = "eval/"


class ReportError(ValueError):
    """Input the report cannot use (unknown experiment, unwritable plot path, ...)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Compare FlashREINFORCE runs and evaluations with the paper's reported numbers, under the "
                    "paper's protocol.",
        epilog="Exit status: 0 success; 1 a table with no measured cell (the tags looked for and the closest ones "
               "the runs have are named); 2 bad input.",
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="Hydra run directory, multirun sweep directory (all its jobs become rows), or eval "
                             "directory (eval.json)")
    parser.add_argument("--experiment", metavar="NAME",
                        help="experiment whose paper numbers and protocol to use (default: the one each run recorded)")
    parser.add_argument("--view", choices=VIEWS, default="paper",
                        help="paper: the paper's table per experiment (Markdown adds the compare view); compare: "
                             "paper | run | difference per run and measure (default: paper)")
    parser.add_argument("--format", choices=FORMATS, default="md", help="table format (default: md)")
    parser.add_argument("--target", metavar="SCORE", type=float, default=None,
                        help="score to reach, in the target metric's unit (e.g. 38 for 38 %%), for the rollouts and "
                             "GPU-hours to reach it (default: the paper's number for the experiment's target row)")
    parser.add_argument("--plot", metavar="FILE.png", type=Path,
                        help="also draw learning curves with the paper's points overlaid")
    parser.add_argument("--paper-results", metavar="FILE.yaml", type=Path, default=None,
                        help=f"reported numbers to compare with (default: the packaged {DEFAULT_PATH.name})")
    return parser


def _experiment_name(run, record, forced: str | None, paper: PaperResults) -> str:
    name = forced or run.experiment() or (record.experiment if record else None)
    if name is None:
        raise ReportError(
            f"cannot tell which experiment {run.path} ran (no experiment_name in .hydra/config.yaml, no "
            f"experiment choice or override); pass --experiment NAME, one of: {', '.join(paper.experiments)}"
        )
    if name not in paper.experiments:
        raise ReportError(
            f"{run.path} ran experiment {name!r}, which has no entry in {paper.path.name}; pass --experiment "
            f"NAME, one of: {', '.join(paper.experiments)}"
        )
    return name


def collect(paper: PaperResults, run_dirs: list[str], forced_experiment: str | None) -> dict[str, list[RunData]]:
    """Runs grouped by experiment, in command-line order, each with its scalars and eval record."""
    if forced_experiment is not None:
        paper.experiment(forced_experiment)  # fail before reading any run
    located = expand_run_dirs(run_dirs)
    runs = [load_run(path) for path, _ in located]
    records = [read_record(path) for path, _ in located]
    grouped: dict[str, list[RunData]] = {}
    for (path, in_sweep), run, record, label in zip(located, runs, records, row_labels(runs)):
        name = _experiment_name(run, record, forced_experiment, paper)
        placement = read_placement(path)
        try:
            data = RunData(run, label, read_scalars(path), placement, record=record)
        except NoEventFilesError as err:
            if not in_sweep:
                raise
            # One failed job should not hide the rest of its sweep.
            print(f"{PROG}: warning: {err}", file=sys.stderr)
            data = RunData(run, label, None, placement, unreadable="no event files", record=record)
        grouped.setdefault(name, []).append(data)
    return grouped


def nothing_measured(experiment: Experiment, runs: list[RunData], metric_ids: list[str]) -> str:
    """The line that says a table has no measured cell: the tags looked for, the closest the runs have."""
    wanted = list(dict.fromkeys(tag for metric_id in metric_ids for alternative in experiment.metrics[metric_id].alternatives
                                for tag in alternative.tags))
    have = sorted({tag for data in runs for tag in (data.scalars or {}) if tag.startswith(EVAL_TAG_PREFIX)})
    closest = []
    for tag in wanted:
        match = difflib.get_close_matches(tag, have, n=1, cutoff=0.6) if tag.startswith(EVAL_TAG_PREFIX) else []
        if match:
            closest.append(f"{match[0]} (for {tag})")
    runs_named = ", ".join(str(data.run.path) for data in runs)
    found = (f"the closest eval tags they have: {', '.join(closest)}" if closest else
             f"their eval tags: {', '.join(have)}" if have else "they have no eval tags at all")
    return (f"{experiment.name}: no measured cell could be filled from {runs_named}; looked for "
            f"{', '.join(wanted)}; {found}. Check that the data command wrote the eval datasources these tags "
            f"name (molt-flashreinforce-data {experiment.name}) and that the runs evaluated them.")


def _empty_tables(args, experiments, compared, tables) -> list[str]:
    """One line per experiment whose printed tables have no measured cell (Markdown's paper view
    prints both views: either one filled is enough)."""
    paper_filled = {table.experiment.name: table.measured for table in tables}
    compare_filled = {experiment.name: any(row.measurement.value is not None for row in rows)
                      for experiment, rows in compared}
    lines = []
    for experiment, runs in experiments:
        printed = []
        if experiment.name in paper_filled:
            printed.append((paper_filled[experiment.name], list(experiment.layout.columns)))
        if args.view == "compare" or args.format == "md":
            printed.append((compare_filled[experiment.name], [row.metric for row in experiment.rows]))
        if printed and not any(filled for filled, _ in printed):
            metric_ids = list(dict.fromkeys(metric_id for _, ids in printed for metric_id in ids))
            lines.append(nothing_measured(experiment, runs, metric_ids))
    return lines


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.plot is not None and not args.plot.parent.is_dir():
            raise ReportError(f"cannot write the plot to {args.plot}: directory {args.plot.parent} does not exist")
        paper = load_paper_results(args.paper_results)
        grouped = collect(paper, args.run_dirs, args.experiment)
        experiments = [(paper.experiments[name], runs) for name, runs in grouped.items()]
        compared = [(experiment, build_rows(paper, experiment, runs)) for experiment, runs in experiments]
        tables = []
        if args.view == "paper":
            tables = [paper_table.build(paper, experiment, runs, args.target)
                      for experiment, runs in experiments if experiment.layout is not None]
            sys.stdout.write(paper_render.render(tables, args.format))
        if args.view == "compare" or args.format == "md":
            if args.view == "paper":
                sys.stdout.write("\n## Beside the paper, run by run\n\n")
            sys.stdout.write(render(compared, args.format, paper))
        empty = _empty_tables(args, experiments, compared, tables)
        if args.format == "md":
            for experiment, runs in experiments:
                sys.stdout.write("\n" + "\n".join(lag.markdown(experiment, lag.lag_rows(paper, experiment, runs))) + "\n")
        if args.plot is not None:
            try:
                from molt_flashreinforce.report.plot import plot_runs  # matplotlib only when plotting
            except ImportError as err:
                raise ReportError(f"--plot needs matplotlib ({err}); install molt-flashreinforce[report]") from None
            plot_runs(paper, experiments, args.plot)
            print(f"{PROG}: wrote {args.plot}", file=sys.stderr)
    except (PaperResultsError, RunDirError, NoEventFilesError, ReportError, EvalRecordError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    for line in empty:
        print(f"{PROG}: error: {line}", file=sys.stderr)
    return 1 if empty else 0


if __name__ == "__main__":
    sys.exit(main())
