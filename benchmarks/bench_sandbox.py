"""Throughput and latency of the Python tool's sandbox on a trivial program.

    python benchmarks/bench_sandbox.py --label after --out experiments/bench_sandbox_after.json

Runs ``print(1)`` through the public API: ``--calls-1`` calls one after another with
``run_python`` (concurrency 1), then ``--calls-32`` calls through ``run_python_async`` with 32
in flight at once (the tool task's shape: many rollouts calling the tool together). For each it
prints and writes calls/s and the p50/p99 latency of a single call. A few untimed calls first
let the one-time isolation probe and the page cache settle. Every call must print ``1``, or the
benchmark stops: a fast sandbox that fails is no result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time

from molt_flashreinforce.agents.sandbox import SandboxLimits, isolation, run_python, run_python_async

PROGRAM = "print(1)"


def _check(result) -> None:
    if result.stdout != "1\n":
        raise SystemExit(f"sandbox call failed during the benchmark: {result!r}")


def _timed(limits: SandboxLimits) -> float:
    start = time.perf_counter()
    _check(run_python(PROGRAM, limits))
    return time.perf_counter() - start


async def _timed_async(limits: SandboxLimits, gate: asyncio.Semaphore) -> float:
    async with gate:
        start = time.perf_counter()
        _check(await run_python_async(PROGRAM, limits))
        return time.perf_counter() - start


def _summary(latencies: list[float], wall_s: float) -> dict:
    ordered = sorted(latencies)
    return {
        "calls": len(ordered),
        "calls_per_s": round(len(ordered) / wall_s, 2),
        "p50_ms": round(1000 * statistics.median(ordered), 1),
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls-1", type=int, default=100, help="sequential calls")
    parser.add_argument("--calls-32", type=int, default=256, help="calls at 32 in flight")
    parser.add_argument("--label", default="current", help="name of this run in the output file")
    parser.add_argument("--out", help="JSON file to write the numbers to")
    args = parser.parse_args()

    limits = SandboxLimits(timeout_s=30.0)
    mode = isolation().mode
    for _ in range(5):
        _timed(limits)

    start = time.perf_counter()
    sequential = [_timed(limits) for _ in range(args.calls_1)]
    results = {"1": _summary(sequential, time.perf_counter() - start)}

    async def concurrent() -> tuple[list[float], float]:
        gate = asyncio.Semaphore(32)
        start = time.perf_counter()
        latencies = await asyncio.gather(*(_timed_async(limits, gate) for _ in range(args.calls_32)))
        return list(latencies), time.perf_counter() - start

    latencies, wall_s = asyncio.run(concurrent())
    results["32"] = _summary(latencies, wall_s)

    record = {
        "label": args.label,
        "isolation_mode": mode,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "concurrency": results,
    }
    for level, numbers in results.items():
        print(f"{args.label} concurrency {level:>2}: {numbers['calls_per_s']:7.2f} calls/s, "
              f"p50 {numbers['p50_ms']:7.1f} ms, p99 {numbers['p99_ms']:7.1f} ms ({numbers['calls']} calls)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
