"""Wall-clock cost of grading 128 answers at once, honest, hostile and mixed, before and after.

    python benchmarks/bench_grading.py --out experiments/benchmarks/grading.json
    python benchmarks/bench_grading.py --before-from experiments/benchmarks/grading.json --out ...

Grades a 128-rollout batch the way the math agent does (``grade_async``, all 128 in flight)
with each grader in turn: ``before``, the grader as it was before the hostile-answer work (read
with ``git show <--before-ref>:molt_flashreinforce/agents/grading.py`` into a temporary
directory and imported from there, under another name; it exists only inside this benchmark),
and ``after``, this checkout's. Both get the same ``--timeout`` and the same number of grader
processes (``MATH_GRADER_PROCESSES``, default: this machine's CPUs). ``--before-from`` keeps the
before numbers of an earlier run instead (the old grader needs minutes on the hostile batches).
Batches:

* ``honest``: 128 correct answers in math-verify's equivalent forms (fractions, decimals,
  ``x=``, sets, intervals, roots), against their ground truths;
* ``hostile``: 128 answers of the shapes a collapsing policy sends (power towers, factorial
  chains, deep nesting, and one that passes every screen but takes sympy about 15 s);
* ``mixed``: 64 of each, interleaved.

It prints and writes, per grader and batch, the batch's wall time, the slowest single grade,
how many honest answers were graded correct, and how many grades timed out. Each grader is
warmed up first (its processes started), so start-up is not in the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GRADING = "molt_flashreinforce/agents/grading.py"
BATCH = 128
HONEST = [
    (r"\frac{1}{2}", "0.5"), (r"\dfrac{3}{4}", "3/4"), ("0.75", r"\frac34"), (r"2\sqrt{2}", r"\sqrt{8}"),
    ("x=5", "5"), ("10^{3}", "1000"), (r"\{1,2\}", r"\{2,1\}"), ("[0,1)", "[0, 1)"),
    (r"\frac{\pi}{2}", r"\pi/2"), ("x^2+2x+1", "(x+1)^2"), (r"\sqrt[3]{2}", "2^{1/3}"), ("2.0", "2"),
]  # fmt: skip
HOSTILE = [
    ("9^{9^{9}}", "1"), ("10^{10^{10}}", "1"), ("2^{1000000000}", "1"), ("10!!", "1"),
    ("(" * 30 + "1" + ")" * 30, "1"), ("(x+y+1)^{100}", "(x-y+1)^{100}"),
]  # fmt: skip


def _before(workdir: str, ref: str):
    """The grader at ``ref``, imported as ``grading_before`` (its graders run it by module name)."""
    text = subprocess.run(["git", "-C", str(REPO), "show", f"{ref}:{GRADING}"], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip
    Path(workdir, "grading_before.py").write_text(text)
    sys.path.insert(0, workdir)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [workdir, os.environ.get("PYTHONPATH")]))
    spec = importlib.util.spec_from_file_location("grading_before", os.path.join(workdir, "grading_before.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["grading_before"] = module
    spec.loader.exec_module(module)
    return module


def _batches() -> dict[str, list[tuple[str, str, bool]]]:
    honest = [(*HONEST[i % len(HONEST)], True) for i in range(BATCH)]
    hostile = [(*HOSTILE[i % len(HOSTILE)], False) for i in range(BATCH)]
    mixed = [row for pair in zip(honest[: BATCH // 2], hostile[: BATCH // 2]) for row in pair]
    return {"honest": honest, "hostile": hostile, "mixed": mixed}


async def _grade_batch(grader, rows, timeout_s: float) -> dict:
    async def one(answer, truth):
        start = time.monotonic()
        result = await grader.grade_async(f"So the answer is \\boxed{{{answer}}}.", truth, timeout_s)
        return result, time.monotonic() - start

    start = time.monotonic()
    graded = await asyncio.gather(*(one(answer, truth) for answer, truth, _ in rows))
    wall_s = time.monotonic() - start
    honest = [result for (result, _), (_, _, is_honest) in zip(graded, rows) if is_honest]
    return {
        "wall_s": round(wall_s, 2),
        "slowest_s": round(max(elapsed for _, elapsed in graded), 2),
        "honest": len(honest),
        "honest_correct": sum(result.correct for result in honest),
        "timed_out": sum(result.timed_out for result, _ in graded),
        "hostile_correct": sum(result.correct for (result, _), row in zip(graded, rows) if not row[2]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=3.0, help="grading bound in seconds, both graders")
    parser.add_argument("--before-ref", default="main", help="git revision of the grader to compare against")
    parser.add_argument("--before-from", help="JSON file this script wrote: keep its before numbers (same --timeout, "
                        "processes and batch) rather than spend minutes measuring the old grader again")  # fmt: skip
    parser.add_argument("--out", help="JSON file to write the numbers to")
    args = parser.parse_args()
    processes = int(os.environ.setdefault("MATH_GRADER_PROCESSES", str(len(os.sched_getaffinity(0)))))

    from molt_flashreinforce.agents import grading as after

    results, before_ref = {}, args.before_ref
    if args.before_from:
        earlier = json.loads(Path(args.before_from).read_text())
        settings = {"timeout_s": args.timeout, "grader_processes": processes, "batch": BATCH}
        if {key: earlier[key] for key in settings} != settings:
            parser.error(f"{args.before_from} was measured with other settings than {settings}")
        results["before"], before_ref = earlier["results"]["before"], earlier["before_ref"]
    with tempfile.TemporaryDirectory() as workdir:
        graders = {"after": after} if args.before_from else {"before": _before(workdir, before_ref), "after": after}
        for name, grader in graders.items():
            # Start every grader process before timing (the pools start them on demand); this
            # checkout's graders warm up before they serve, so wait until all of them are up.
            asyncio.run(_grade_batch(grader, [(*HONEST[0], True)] * processes, 120.0))
            started = time.monotonic()
            while hasattr(grader, "POOL") and len(grader.POOL.grader_pids()) < processes:
                if time.monotonic() - started > 120:
                    sys.exit(f"only {len(grader.POOL.grader_pids())} of {processes} graders started in 120 s")
                time.sleep(0.05)
            results[name] = {batch: asyncio.run(_grade_batch(grader, rows, args.timeout))
                             for batch, rows in _batches().items()}  # fmt: skip
    ratios = {batch: round(results["before"][batch]["wall_s"] / results["after"][batch]["wall_s"], 1)
              for batch in results["after"]}  # fmt: skip
    for name, batches in results.items():
        for batch, numbers in batches.items():
            print(f"{name:6} {batch:7}: {numbers['wall_s']:7.2f} s for {BATCH}, slowest {numbers['slowest_s']:6.2f} s, "
                  f"honest correct {numbers['honest_correct']}/{numbers['honest']}, timed out {numbers['timed_out']}, "
                  f"hostile graded correct {numbers['hostile_correct']}")
    print("before / after wall time: " + ", ".join(f"{batch} x{ratio}" for batch, ratio in ratios.items()))
    if args.out:
        record = {"cpus": os.cpu_count(), "grader_processes": processes, "timeout_s": args.timeout, "batch": BATCH,
                  "before_ref": before_ref, "python": platform.python_version(), "results": results,
                  "before_over_after": ratios}  # fmt: skip
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
