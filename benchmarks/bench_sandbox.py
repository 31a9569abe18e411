"""Throughput and latency of the Python tool's sandbox against the first sandbox, in one process.

    python benchmarks/bench_sandbox.py --out experiments/benchmarks/sandbox.json

Runs ``print(1)`` through each implementation's public API: calls one after another with
``run_python`` (concurrency 1), then calls through ``run_python_async`` with 32 in flight (the
tool task's shape: many rollouts calling the tool together). The two implementations take turns
in ``--rounds`` interleaved rounds, so both see the same machine load. It prints and writes
calls/s and the p50/p99 latency of one call for each, and the ratios new / old. A few untimed
calls first let each one's isolation probe and the page cache settle. Every call must print
``1``, or the benchmark stops: a fast sandbox that fails is no result.

The old implementation is read from git (the parent of the commit that removed its
``jail.py``) into a temporary directory and imported from there, under another name; it exists
only inside this benchmark. A clone without that history (a shallow one) measures the current
sandbox alone and says so; ``git fetch --unshallow`` brings the comparison back.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from molt_flashreinforce.agents import sandbox

PROGRAM = "print(1)"
REPO = Path(__file__).resolve().parents[1]
OLD_FILES = ("executor.py", "jail.py")
SANDBOX_DIR = "molt_flashreinforce/agents/sandbox"


def _git(*arguments: str) -> str | None:
    done = subprocess.run(["git", "-C", str(REPO), *arguments], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def _old_sandbox(workdir: str):
    """The first sandbox's executor, imported from its last commit as ``first_sandbox``; None when
    this clone's history does not reach it."""
    removal = (_git("rev-list", "-1", "HEAD", "--", f"{SANDBOX_DIR}/jail.py") or "").strip()
    texts = {name: _git("show", f"{removal}^:{SANDBOX_DIR}/{name}") if removal else None for name in OLD_FILES}
    if None in texts.values():
        print("bench_sandbox: the first sandbox (jail.py) is not in this clone's history (a shallow clone?); "
              "measuring the current sandbox alone (git fetch --unshallow for the comparison)", flush=True)
        return None
    for name, text in texts.items():
        # Its one package import becomes a sibling import; the jail runs by path as before.
        text = text.replace("from molt_flashreinforce.agents.sandbox.jail import", "from first_sandbox_jail import")
        Path(workdir, "first_sandbox_jail.py" if name == "jail.py" else "first_sandbox.py").write_text(text)
    Path(workdir, "jail.py").write_text(Path(workdir, "first_sandbox_jail.py").read_text())
    sys.path.insert(0, workdir)
    spec = importlib.util.spec_from_file_location("first_sandbox", os.path.join(workdir, "first_sandbox.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["first_sandbox"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _check(result) -> None:
    if result.stdout != "1\n":
        raise SystemExit(f"sandbox call failed during the benchmark: {result!r}")


def _sequential(impl, limits, calls: int) -> list[float]:
    latencies = []
    for _ in range(calls):
        start = time.perf_counter()
        _check(impl.run_python(PROGRAM, limits))
        latencies.append(time.perf_counter() - start)
    return latencies


def _concurrent(impl, limits, calls: int) -> tuple[list[float], float]:
    async def one(gate: asyncio.Semaphore) -> float:
        async with gate:
            start = time.perf_counter()
            _check(await impl.run_python_async(PROGRAM, limits))
            return time.perf_counter() - start

    async def all_calls() -> tuple[list[float], float]:
        gate = asyncio.Semaphore(32)
        start = time.perf_counter()
        latencies = await asyncio.gather(*(one(gate) for _ in range(calls)))
        return list(latencies), time.perf_counter() - start

    return asyncio.run(all_calls())


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
    parser.add_argument("--calls-1", type=int, default=40, help="sequential calls per round and implementation")
    parser.add_argument("--calls-32", type=int, default=96, help="calls at 32 in flight per round and implementation")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--out", help="JSON file to write the numbers to")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as workdir:
        old = _old_sandbox(workdir)
        impls = {"new": sandbox} if old is None else {"old": old, "new": sandbox}
        modes = {name: impl.isolation().mode for name, impl in impls.items()}
        limits = {name: impl.SandboxLimits(timeout_s=30.0) for name, impl in impls.items()}
        for name, impl in impls.items():
            _sequential(impl, limits[name], 5)
        sequential = {name: ([], 0.0) for name in impls}
        concurrent = {name: ([], 0.0) for name in impls}
        for _ in range(args.rounds):
            for name, impl in impls.items():
                start = time.perf_counter()
                latencies = _sequential(impl, limits[name], args.calls_1)
                sequential[name] = (sequential[name][0] + latencies, sequential[name][1] + time.perf_counter() - start)
            for name, impl in impls.items():
                latencies, wall_s = _concurrent(impl, limits[name], args.calls_32)
                concurrent[name] = (concurrent[name][0] + latencies, concurrent[name][1] + wall_s)

    results = {
        name: {"isolation_mode": modes[name], "1": _summary(*sequential[name]), "32": _summary(*concurrent[name])}
        for name in impls
    }
    ratios = {} if "old" not in impls else {
        level: {
            "p50_new_over_old": round(results["new"][level]["p50_ms"] / results["old"][level]["p50_ms"], 2),
            "calls_per_s_new_over_old": round(
                results["new"][level]["calls_per_s"] / results["old"][level]["calls_per_s"], 2
            ),
        }
        for level in ("1", "32")
    }
    for name in impls:
        for level in ("1", "32"):
            numbers = results[name][level]
            print(f"{name} ({modes[name]}) concurrency {level:>2}: {numbers['calls_per_s']:7.2f} calls/s, "
                  f"p50 {numbers['p50_ms']:7.1f} ms, p99 {numbers['p99_ms']:7.1f} ms ({numbers['calls']} calls)")
    for level, ratio in ratios.items():
        print(f"new / old at concurrency {level:>2}: p50 latency x{ratio['p50_new_over_old']}, "
              f"calls/s x{ratio['calls_per_s_new_over_old']}")
    if args.out:
        record = {"cpus": os.cpu_count(), "python": platform.python_version(), "rounds": args.rounds,
                  "results": results, "ratios": ratios}  # fmt: skip
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
