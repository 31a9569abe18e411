"""`molt-flashreinforce-report`: put runs beside the paper's reported numbers.

    molt-flashreinforce-report RUN_DIR... [--experiment NAME] [--format md|csv|latex] [--plot FILE.png]

Each RUN_DIR is a Hydra run directory (or a multirun sweep directory, which expands to its
jobs) whose TensorBoard event files were written by Molt or by the local backend. Runs are
grouped by experiment (`--experiment`, else the one recorded in the run's Hydra config); each
experiment prints one table: paper | this run | difference, one block of rows per run, with
what the run had spent by the step used (rollouts, wall-clock, GPU-hours, tokens). The Markdown
output then lists each run's measured policy lag beside the paper's (`lag.py`).
Exit status 0 on success, 2 on bad input (with a message that says what to fix).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from molt_flashreinforce.report import lag
from molt_flashreinforce.report.events import NoEventFilesError, read_scalars
from molt_flashreinforce.report.paper import DEFAULT_PATH, PaperResults, PaperResultsError, load_paper_results
from molt_flashreinforce.report.placement import read_placement
from molt_flashreinforce.report.runs import RunDirError, expand_run_dirs, load_run, row_labels
from molt_flashreinforce.report.table import FORMATS, RunData, build_rows, render

PROG = "molt-flashreinforce-report"


class ReportError(ValueError):
    """Input the report cannot use (unknown experiment, unwritable plot path, ...)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Compare FlashREINFORCE runs with the paper's reported numbers, under the paper's protocol.",
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="Hydra run directory, or a multirun sweep directory (all its jobs become rows)")
    parser.add_argument("--experiment", metavar="NAME",
                        help="experiment whose paper numbers and protocol to use (default: the one each run recorded)")
    parser.add_argument("--format", choices=FORMATS, default="md", help="table format (default: md)")
    parser.add_argument("--plot", metavar="FILE.png", type=Path,
                        help="also draw learning curves with the paper's points overlaid")
    parser.add_argument("--paper-results", metavar="FILE.yaml", type=Path, default=None,
                        help=f"reported numbers to compare with (default: the packaged {DEFAULT_PATH.name})")
    return parser


def _experiment_name(run, forced: str | None, paper: PaperResults) -> str:
    name = forced or run.experiment()
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
    """Runs grouped by experiment, in command-line order, each with its scalars."""
    if forced_experiment is not None:
        paper.experiment(forced_experiment)  # fail before reading any run
    located = expand_run_dirs(run_dirs)
    runs = [load_run(path) for path, _ in located]
    grouped: dict[str, list[RunData]] = {}
    for (path, in_sweep), run, label in zip(located, runs, row_labels(runs)):
        name = _experiment_name(run, forced_experiment, paper)
        placement = read_placement(path)
        try:
            data = RunData(run, label, read_scalars(path), placement)
        except NoEventFilesError as err:
            if not in_sweep:
                raise
            # One failed job should not hide the rest of its sweep.
            print(f"{PROG}: warning: {err}", file=sys.stderr)
            data = RunData(run, label, None, placement, unreadable="no event files")
        grouped.setdefault(name, []).append(data)
    return grouped


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.plot is not None and not args.plot.parent.is_dir():
            raise ReportError(f"cannot write the plot to {args.plot}: directory {args.plot.parent} does not exist")
        paper = load_paper_results(args.paper_results)
        grouped = collect(paper, args.run_dirs, args.experiment)
        experiments = [(paper.experiments[name], runs) for name, runs in grouped.items()]
        tables = [(experiment, build_rows(paper, experiment, runs)) for experiment, runs in experiments]
        sys.stdout.write(render(tables, args.format, paper))
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
    except (PaperResultsError, RunDirError, NoEventFilesError, ReportError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
