"""A rehearsal's policy-lag curve, and whether it holds a lag target (the checks of the bound).

    lag_curve(run_dir) -> [LagPoint(step, mean, max, at_bound, dropped), ...]   # from TensorBoard
    lag_target_problems(curve, bound, settle_step, band) -> [problem, ...]      # [] when it holds

`python -m molt_flashreinforce.rehearsal.lag_check RUN_DIR [--bound N --settle-step S --band LO HI]`
prints the curve (and the problems, exiting 1 when there are any).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from molt_flashreinforce import metrics


@dataclass(frozen=True)
class LagPoint:
    step: int
    mean: float
    max: float
    at_bound: float | None  # None: the run had no bound
    dropped: float | None


def lag_curve(run_dir: str | Path) -> list[LagPoint]:
    from molt_flashreinforce.report.events import read_scalars

    scalars = read_scalars(Path(run_dir) / "tensorboard")
    by_tag = {tag: dict(scalars.get(tag, ())) for tag in (metrics.POLICY_LAG_MEAN, metrics.POLICY_LAG_MAX,
                                                            metrics.POLICY_LAG_AT_BOUND, metrics.POLICY_LAG_DROPPED)}
    means = by_tag[metrics.POLICY_LAG_MEAN]
    return [LagPoint(step, means[step], by_tag[metrics.POLICY_LAG_MAX][step],
                     by_tag[metrics.POLICY_LAG_AT_BOUND].get(step), by_tag[metrics.POLICY_LAG_DROPPED].get(step))
            for step in sorted(means)]


def lag_target_problems(curve: list[LagPoint], bound: int, settle_step: int = 10,
                        band: tuple[float, float] = (7.0, 9.0)) -> list[str]:
    """Why the curve misses the target: from `settle_step` on every step's mean lies in `band`, and
    no step's max ever passes `bound` + 1 (the issue's target for the MoE: bound 8, [7, 9], max 9;
    the bound itself makes the max at most `bound`)."""
    problems = []
    settled = [point for point in curve if point.step >= settle_step]
    if not settled:
        problems.append(f"no step at or after step {settle_step} logged a lag (steps: {[p.step for p in curve]})")
    problems += [f"step {p.step}: lag mean {p.mean:g} outside [{band[0]:g}, {band[1]:g}]" for p in settled
                 if not band[0] <= p.mean <= band[1]]
    problems += [f"step {p.step}: lag max {p.max:g} above {bound + 1}" for p in curve if p.max > bound + 1]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m molt_flashreinforce.rehearsal.lag_check")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--bound", type=int, default=None, help="check the target for this bound")
    parser.add_argument("--settle-step", type=int, default=10)
    parser.add_argument("--band", type=float, nargs=2, default=(7.0, 9.0), metavar=("LO", "HI"))
    args = parser.parse_args(argv)
    curve = lag_curve(args.run_dir)
    print("step  lag mean  lag max  at bound  dropped")
    for p in curve:
        extra = "" if p.at_bound is None else f"  {p.at_bound:8g}  {'-' if p.dropped is None else f'{p.dropped:g}':>7}"
        print(f"{p.step:4d}  {p.mean:8.2f}  {p.max:7g}{extra}")
    if args.bound is None:
        return 0
    problems = lag_target_problems(curve, args.bound, args.settle_step, tuple(args.band))
    for problem in problems:
        print(f"MISSED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
