"""Collect rehearsal summaries into experiments/rehearsal/results.{json,md} and faults.md.

    python experiments/rehearsal/collect.py [--note TEXT] RUN_DIR [RUN_DIR ...]

Each RUN_DIR is a `rehearsal=cpu` run directory (it holds rehearsal/summary.json). The table
gives what docs/rehearsal.md and the README quote: the rollout engine, steps, lag, acceptance,
reward, the engine-vs-trainer mismatch at step 1 (vllm_kl, sequence Bernoulli KL against delta,
share admitted), weight checks (landed / refits; a resumed run also refits once at its start), the Ray
nodes that hosted the run's actors with what each hosted, and wall time per phase, with the
machine it was measured on.

A run the fault-injection tests struck (tests/test_rehearsal_runs.py records the strike in
`fault.json`) also gets a row in faults.md (docs/launch.md, "Faults and restarts" includes it):
from its attempts (`launch/attempts.json`), how long after the strike the attempt it hit ended,
how long until the next attempt started, the steps before and where it resumed, and the one line.
Runs without a fault leave faults.md as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).parent


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def fault_row(run_dir: Path, experiment: str, algo: str) -> dict | None:
    """The struck attempt of a run and the one after it, or None for a run no fault struck."""
    record, attempts = run_dir / "fault.json", run_dir / "launch" / "attempts.json"
    if not (record.is_file() and attempts.is_file()):
        return None
    fault, attempts = json.loads(record.read_text()), json.loads(attempts.read_text())
    hit = next(i for i, a in enumerate(attempts) if a["ended"] and _seconds(a["ended"]) >= fault["struck_at"] - 1)
    struck, resumed = attempts[hit], attempts[hit + 1]
    return {"experiment": experiment, "algo": algo, "fault": fault["fault"], "step_struck": fault["after_step"],
            "attempt_ended_after_s": round(_seconds(struck["ended"]) - fault["struck_at"], 1),
            "next_attempt_after_s": round(_seconds(resumed["started"]) - _seconds(struck["ended"]), 1),
            "resumed_from_step": resumed["resumed_from_step"],
            "cause": struck["cause"].replace(str(run_dir), "<run>")}  # no machine's path in the docs


def main(run_dirs: list[str], note: str = "") -> None:
    rows, faults = [], []
    for run_dir in run_dirs:
        summary = json.loads((Path(run_dir) / "rehearsal" / "summary.json").read_text())
        rows.append({key: summary[key] for key in (
            "experiment", "algo", "steps", "resumed_from_step", "policy_lag_mean", "policy_lag_max",
            "versions_mixed_fraction", "acceptance_rate", "reward_mean", "vllm_kl_first_step", "ray_nodes",
            "actors_by_node", "phases_s")}
            | {"engine": summary.get("engine", "standin")}  # summaries from before rehearsal.engine: the stand-in
            | {key: summary.get(key) for key in ("sequence_kl_first_step", "delta", "acceptance_first_step")}
            | {"weight_checks_landed": sum("landed on every" in line for line in summary["weight_checks"]),
               "weight_checks": len(summary["weight_checks"]),
               "wall_s": round(sum(summary["phases_s"].values()), 1)})
        faults += filter(None, [fault_row(Path(run_dir), summary["experiment"], summary["algo"])])
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    (HERE / "results.json").write_text(json.dumps({"machine": machine, "note": note, "rehearsals": rows, "faults": faults}, indent=1) + "\n")

    def split(row):
        def hosting(actor):
            return ", ".join(node for node, actors in row["actors_by_node"].items() if actor in actors)

        engine_actor = "CpuRolloutEngine" if row["engine"] == "standin" else "RolloutRayActor"
        return f"{row['ray_nodes']}: {hosting('PolicyModelActor')} / {hosting(engine_actor)}"

    def fmt(value):
        return "n/a" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)

    lines = [f"Measured on {machine}{f', {note}' if note else ''} (`python experiments/rehearsal/collect.py` "
             "over the run directories).", "",
             "| experiment | algo | engine | steps | lag mean / max | spanning a refit | acceptance | reward | vllm_kl step 1 "
             "| sequence KL step 1 (delta) | admitted step 1 | refits checked | Ray nodes: policy actor / engine nodes | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        steps = f"{row['steps']}" + (f" (resumed at {row['resumed_from_step']})" if row["resumed_from_step"] else "")
        lines.append(
            f"| {row['experiment']} | {row['algo']} | {row['engine']} | {steps} | {fmt(row['policy_lag_mean'])} / {fmt(row['policy_lag_max'])} "
            f"| {fmt(row['versions_mixed_fraction'])} "
            f"| {fmt(row['acceptance_rate'])} | {fmt(row['reward_mean'])} | {fmt(row['vllm_kl_first_step'])} "
            f"| {fmt(row['sequence_kl_first_step'])} ({fmt(row['delta'])}) | {fmt(row['acceptance_first_step'])} "
            f"| {row['weight_checks_landed']}/{row['weight_checks']} | {split(row)} | {row['wall_s']} |"
        )
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    if not faults:  # runs without a fault leave the fault table as it was measured
        return
    lines = [f"Measured on {machine}{f', {note}' if note else ''}, by the fault-injection rehearsals of "
             "tests/test_rehearsal_runs.py (`python experiments/rehearsal/collect.py`; times to the second).", "",
             "| experiment | algo | fault (after step) | attempt ended after | next attempt after | resumed from step | the line |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {f['experiment']} | {f['algo']} | {f['fault']} ({f['step_struck']}) | {f['attempt_ended_after_s']:.0f} s "
              f"| {f['next_attempt_after_s']:.0f} s | {f['resumed_from_step']} | `{f['cause']}` |" for f in faults]
    (HERE / "faults.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+")
    parser.add_argument("--note", default="", help="what else ran on the machine meanwhile")
    options = parser.parse_args()
    main(options.run_dirs, options.note)
