"""The tiny comparison, one command: FlashREINFORCE against GRPO on the CPU miniature, with enough
seeds to tell the paper's claims apart (experiments/tiny/README.md says what it supports).

    python experiments/tiny/compare.py [--out runs/tiny_comparison] [--workers 2]

Every job is the main command's configuration (`molt-flashreinforce experiment=tiny`) with a few
overrides, run through the same app entry point. Jobs run `--workers` at a time (one torch thread
each) and are skipped when their `summary.json` exists, so an interrupted comparison continues
where it stopped (an interrupted job resumes from its checkpoint). Within a seed every arm starts
from the same warm start (`local.warm_start.cache_dir`). Stages:

  calibrate  FlashREINFORCE at the paper's delta, lags 1 and 8, for each lr of LR_GRID: the policy's
             movement per update and over the lag (mean sequence Bernoulli KL, acceptance). The lag
             study's lr is the largest one whose lag-1 gate rejects at most REGIME_MAX_REJECTION of
             the trajectories: the paper's math run rejects 0.13 % at delta = 3e-3.
  claim1     FlashREINFORCE 128 prompts x 1 against GRPO 32 x 4, lag 0, tiny.yaml's lr, Plan.seeds_claim1.
  claim2     at the calibrated lr, lags LAGS: FlashREINFORCE at delta = 3e-3 and delta = inf, and GRPO
             (at lag 0 the learner is the sampler, so delta = inf would be the same run), Plan.seeds_lag.
  fast_lr    FAST_LR = 3e-4 at lag 8 for the same three arms, Plan.seeds_lag: the second, labelled regime,
             where the policy moves far more than delta during the lag.
  noise      the eval's own noise: claim1's final FlashREINFORCE policies, re-evaluated with
             NOISE_SAMPLINGS other sampling seeds.

Then `summarize.py` writes results.md, results.json and results.png into `--results`, and the
report command writes report_lag0_seed0.md (claim 1, seed 0: both arms).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

DELTA = 3e-3  # the paper's delta for the math run [T15]
TINY = Path(__file__).resolve().parents[2] / "molt_flashreinforce" / "conf" / "experiment" / "tiny.yaml"
FAST_LR = 3e-4  # the lr of the first comparison, whose lag-8 gate rejected most trajectories
LR_GRID = (3e-4, 1e-4, 5e-5)
REGIME_MAX_REJECTION = 0.01
CALIBRATION_SEEDS = (0, 1)
LAGS = (0, 2, 4, 8)
LAG_EVAL_EVERY = 50  # the lag study reads end points and acceptance, not the curve's shape
NOISE_SAMPLINGS = 8


def default_lr() -> float:
    import yaml

    return float(yaml.safe_load(TINY.read_text())["local"]["lr"])


@dataclass(frozen=True)
class Plan:
    """How much to run; the defaults are the committed comparison."""

    seeds_claim1: tuple[int, ...] = tuple(range(8))
    seeds_lag: tuple[int, ...] = tuple(range(5))
    calibration_steps: int = 100
    overrides: tuple[str, ...] = ()  # added to every job (a miniature of the comparison, in tests)


@dataclass(frozen=True)
class Job:
    stage: str
    name: str
    overrides: tuple[str, ...]


def _delta_text(delta: float) -> str:
    return "inf" if delta == float("inf") else f"{delta:g}"


def _arm_overrides(algo: str, delta: float | None, lag: int, lr: float, seed: int) -> tuple[str, ...]:
    overrides = [f"algo={algo}", f"local.policy_lag={lag}", f"local.lr={lr:g}", f"seed={seed}"]
    if delta is not None:
        overrides.append(f"algo.delta={_delta_text(delta)}")
    return tuple(overrides)


def _arm_name(algo: str, delta: float | None, lag: int, lr: float, seed: int) -> str:
    gate = "" if delta is None else f"_delta{_delta_text(delta)}"
    return f"{algo}{gate}_lag{lag}_lr{lr:g}_seed{seed}"


def _job(stage: str, algo: str, delta: float | None, lag: int, lr: float, seed: int, *extra: str) -> Job:
    return Job(stage, _arm_name(algo, delta, lag, lr, seed), _arm_overrides(algo, delta, lag, lr, seed) + extra)


def calibration_jobs(plan: Plan) -> list[Job]:
    return [_job("calibrate", "flashreinforce", DELTA, lag, lr, seed, f"local.steps={plan.calibration_steps}",
                 *plan.overrides)
            for lr in LR_GRID for lag in (1, 8) for seed in CALIBRATION_SEEDS]


def calibrated_lr(calibration: dict[float, dict], max_rejection: float) -> float:
    admitted = [lr for lr in LR_GRID if calibration[lr]["lag1"]["rejection"] <= max_rejection]
    if not admitted:
        raise SystemExit(f"no lr in {LR_GRID} keeps the lag-1 rejection at or below {max_rejection:.0%}; "
                         "extend LR_GRID downwards")
    return max(admitted)


def claim1_jobs(plan: Plan, lr: float) -> list[Job]:
    # Every seed's first job before any seed's second, so that two workers never compute one
    # seed's warm start at the same time.
    return [_job("claim1", algo, delta, 0, lr, seed, *plan.overrides)
            for algo, delta in (("flashreinforce", DELTA), ("grpo", None)) for seed in plan.seeds_claim1]


def lag_jobs(plan: Plan, stage: str, lr: float, lags: tuple[int, ...]) -> list[Job]:
    jobs = []
    extra = (f"local.eval.every={LAG_EVAL_EVERY}", *plan.overrides)
    for lag in lags:
        for seed in plan.seeds_lag:
            jobs.append(_job(stage, "flashreinforce", DELTA, lag, lr, seed, *extra))
            if lag:
                jobs.append(_job(stage, "flashreinforce", float("inf"), lag, lr, seed, *extra))
            jobs.append(_job(stage, "grpo", None, lag, lr, seed, *extra))
    return jobs


# ── running jobs ──

def _run(job_dir: str, overrides: tuple[str, ...], warm_starts: str) -> dict:
    """One job in a worker process: compose the app's config, run it, return its summary."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from molt_flashreinforce.app import dispatch

    directory = Path(job_dir)
    summary_file = directory / "summary.json"
    if summary_file.is_file():
        return json.loads(summary_file.read_text())
    overrides = ("experiment=tiny", "local.progress_bar=false", f"local.warm_start.cache_dir={warm_starts}",
                 *overrides)
    with initialize_config_module("molt_flashreinforce.conf", version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    (directory / ".hydra").mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, directory / ".hydra" / "config.yaml")  # what a Hydra job keeps; summarize.py reads it
    (directory / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml(list(overrides)))
    with open(directory / "job.log", "a") as log, redirect_stdout(log), redirect_stderr(log):
        dispatch.run(cfg, directory)
    return json.loads(summary_file.read_text())


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)


def run_jobs(jobs: list[Job], out: Path, workers: int) -> None:
    warm_starts = str(out / "warm_starts")
    started = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_worker_init) as pool:
        futures = {pool.submit(_run, str(out / job.stage / job.name), job.overrides, warm_starts): job for job in jobs}
        for done, future in enumerate(as_completed(futures), 1):
            job, summary = futures[future], future.result()
            print(f"[{done}/{len(jobs)} {time.perf_counter() - started:6.0f} s] {job.stage}/{job.name}: pass@1 "
                  f"{summary['eval_pass1_start']:.3f} -> {summary['eval_pass1_end']:.3f} ({summary['wall_s']:.0f} s)",
                  flush=True)


def calibration(out: Path) -> dict[float, dict]:
    """Per lr and lag: mean sequence KL to the sampling policy and the rejected fraction, over seeds
    (summarize.py reads the runs, skipping the updates before the lag is reached)."""
    from summarize import collect

    table: dict[float, dict] = {lr: {} for lr in LR_GRID}
    for (_, _, _, _, lag, lr), runs in collect(out, stage="calibrate").items():
        table[lr][f"lag{lag}"] = {"sequence_kl_mean": statistics.fmean(r["sequence_kl"] for r in runs),
                                  "rejection": 1.0 - statistics.fmean(r["acceptance"] for r in runs)}
    return table


def eval_noise(out: Path, jobs: list[Job]) -> dict:
    """Re-evaluate final policies with other sampling seeds: the eval's sampling noise at fixed weights."""
    from omegaconf import OmegaConf

    from molt_flashreinforce.local.checkpoint import latest_checkpoint, load_checkpoint
    from molt_flashreinforce.local.config import LocalConfig
    from molt_flashreinforce.local.trainer import LocalTrainer

    per_policy = []
    for job in jobs:
        directory = out / job.stage / job.name
        cfg = OmegaConf.load(directory / ".hydra" / "config.yaml")
        trainer = LocalTrainer(LocalConfig.from_node(cfg.local), cfg.algo, int(cfg.seed))
        trainer.load_state_dict(load_checkpoint(latest_checkpoint(directory / "checkpoints"))["trainer"])
        values = [next(iter(trainer.evaluate(sampling_seed=10_000 + k).values())) for k in range(NOISE_SAMPLINGS)]
        per_policy.append({"job": job.name, "pass1": values, "std": statistics.stdev(values)})
    size = int(OmegaConf.load(out / jobs[0].stage / jobs[0].name / ".hydra" / "config.yaml").local.task.eval_size)
    return {"eval_size": size, "samplings": NOISE_SAMPLINGS, "policies": per_policy,
            "pooled_std": statistics.fmean(p["std"] ** 2 for p in per_policy) ** 0.5}


def _machine() -> dict:
    return {"cores": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
            "processor": platform.processor() or "unknown", "load_average_before": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/tiny_comparison"), help="job directories")
    parser.add_argument("--results", type=Path, default=Path(__file__).parent, help="where the results go")
    parser.add_argument("--workers", type=int, default=2, help="jobs at a time (each uses one core)")
    parser.add_argument("--seeds-claim1", type=int, default=len(Plan.seeds_claim1), help="seeds 0..N-1 for claim 1")
    parser.add_argument("--seeds-lag", type=int, default=len(Plan.seeds_lag), help="seeds 0..N-1 for the lag study")
    parser.add_argument("--calibration-steps", type=int, default=Plan.calibration_steps)
    parser.add_argument("--regime-max-rejection", type=float, default=REGIME_MAX_REJECTION,
                        help="the lag study's regime: the lag-1 gate rejects at most this fraction")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every job (repeatable): a miniature of the comparison")
    args = parser.parse_args()
    plan = Plan(tuple(range(args.seeds_claim1)), tuple(range(args.seeds_lag)), args.calibration_steps,
                tuple(args.override))
    args.out.mkdir(parents=True, exist_ok=True)
    machine, started = _machine(), time.perf_counter()

    print(f"calibrate: {len(LR_GRID)} lrs x lags 1, 8 x seeds {CALIBRATION_SEEDS}, {plan.calibration_steps} updates",
          flush=True)
    run_jobs(calibration_jobs(plan), args.out, args.workers)
    movement = calibration(args.out)
    lag_lr = calibrated_lr(movement, args.regime_max_rejection)
    print(f"lag study lr: {lag_lr:g} (lag-1 rejection {movement[lag_lr]['lag1']['rejection']:.4f})", flush=True)

    lr = default_lr()
    first = claim1_jobs(plan, lr)
    rest = lag_jobs(plan, "claim2", lag_lr, LAGS) + lag_jobs(plan, "fast_lr", FAST_LR, (8,))
    run_jobs(first + rest, args.out, args.workers)
    noise = eval_noise(args.out, [job for job in first if job.name.startswith("flashreinforce")])

    meta = {"machine": machine, "command": "python experiments/tiny/compare.py " + " ".join(sys.argv[1:]),
            "wall_s": time.perf_counter() - started, "workers": args.workers, "delta": DELTA,
            "default_lr": lr, "fast_lr": FAST_LR, "lag_lr": lag_lr, "regime_max_rejection": args.regime_max_rejection,
            "calibration": {f"{lr:g}": v for lr, v in movement.items()}, "eval_noise": noise}
    (args.out / "comparison.json").write_text(json.dumps(meta, indent=1) + "\n")
    subprocess.run([sys.executable, str(Path(__file__).with_name("summarize.py")), str(args.out),
                    "--out", str(args.results)], check=True)
    # The README's report example: seed 0 of claim 1, FlashREINFORCE beside GRPO.
    pair = [str(args.out / job.stage / job.name) for job in first if job.name.endswith("_seed0")]
    with open(args.results / "report_lag0_seed0.md", "w") as report:
        # The report command by module, so the comparison needs no activated virtualenv; the run-by-run view,
        # which shows each run's cost beside the paper (docs/report.md's example).
        subprocess.run([sys.executable, "-m", "molt_flashreinforce.report.cli", *pair, "--view", "compare"], check=True,
                       stdout=report)


if __name__ == "__main__":
    main()
