"""Per-benchmark scores from the samples, and the table the eval command prints.

Contract: ``benchmark_scores(records) -> {benchmark: BenchmarkScore}``, in first-seen order:

* ``avg`` (avg@k) = mean over problems of the mean reward of the problem's samples: Molt's
  ``eval_<ds>_pass1`` (``compute_eval_metrics``: grouped by prompt, then averaged);
* ``stderr`` = the standard error of that mean over problems, s / sqrt(n) with s the sample
  standard deviation (n - 1) of the per-problem means: the sampling noise of the k samples and the
  spread of the problems together, as lighteval reports it; NaN for a single problem;
* ``tool_calls_mean`` / ``turns_mean`` over samples (None where the agent has no tool).

``render_table(record)`` is the Markdown table with the mean over benchmarks.
"""

from __future__ import annotations

import math
from collections import defaultdict

from molt_flashreinforce.eval_record import GRADERS, BenchmarkScore, EvalRecord


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def standard_error(values: list[float]) -> float:
    if len(values) < 2:
        return math.nan
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


def benchmark_scores(records: list[dict]) -> dict[str, BenchmarkScore]:
    rewards: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    tool_calls: dict[str, list[int]] = defaultdict(list)
    turns: dict[str, list[int]] = defaultdict(list)
    for record in records:
        name = record["benchmark"]
        rewards[name][int(record["problem_id"])].append(float(record["reward"]))
        turns[name].append(int(record["turns"]))
        if record.get("tool_calls") is not None:
            tool_calls[name].append(int(record["tool_calls"]))
    scores = {}
    for name, problems in rewards.items():
        per_problem = [_mean(values) for values in problems.values()]
        scores[name] = BenchmarkScore(
            avg=_mean(per_problem), stderr=standard_error(per_problem), problems=len(per_problem),
            samples=sum(len(values) for values in problems.values()),
            tool_calls_mean=_mean(tool_calls[name]) if tool_calls[name] else None,
            turns_mean=_mean(turns[name]))
    return scores


def _cell(value: float | None, digits: int = 1, scale: float = 1.0) -> str:
    return "" if value is None or math.isnan(value) else f"{value * scale:.{digits}f}"


def render_table(record: EvalRecord) -> str:
    k = record.protocol.avg_at_k
    model = record.model
    status = "" if record.complete else " (incomplete: rerun the same command to finish)"
    lines = [
        f"{record.experiment}: {model.path} (step {model.step}){status}",
        f"protocol: {record.protocol.describe()}; grader: {record.grader}, {GRADERS[record.grader]}; "
        f"engine: {record.engine}",
        "",
        f"| benchmark | avg@{k} (%) | ± s.e. | problems | samples | tool calls | turns |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, score in record.benchmarks.items():
        lines.append(f"| {name} | {_cell(score.avg, scale=100)} | {_cell(score.stderr, scale=100)} | {score.problems} "
                     f"| {score.samples} | {_cell(score.tool_calls_mean, 2)} | {_cell(score.turns_mean, 2)} |")
    if record.mean is not None:
        lines.append(f"| mean | {_cell(record.mean, scale=100)} | | | | | |")
    return "\n".join(lines) + "\n"
