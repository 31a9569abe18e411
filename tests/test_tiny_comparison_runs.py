"""`experiments/tiny/compare.py` end to end on a miniature of the comparison (a 1-layer model on
one-digit addition, a few updates, two seeds): every stage runs through the app's entry point,
arms of a seed share one warm start, `summarize.py` writes its tables, JSON and plot, and a
rerun skips the finished jobs. The committed comparison is the same command without overrides."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MINIATURE = ["local.steps=10", "local.rollouts_per_step=16", "local.task.max_operand=9", "local.task.eval_size=10",
             "local.model.n_layer=1", "local.model.n_embd=32", "local.model.n_head=2", "local.warm_start.steps=20",
             "local.warm_start.batch_size=32", "local.warm_start.lr=1e-2", "local.eval.every=5"]


def _compare(tmp_path: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "experiments/tiny/compare.py"), "--out", str(tmp_path / "runs"),
               "--results", str(tmp_path / "results"), "--seeds-claim1", "2", "--seeds-lag", "2",
               "--calibration-steps", "10", "--regime-max-rejection", "1"]
    command += [f"--override={override}" for override in MINIATURE]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)


def test_the_comparison_runs_every_stage_and_summarizes(tmp_path):
    done = _compare(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results/results.json").read_text())
    assert set(results["arms"]) == {"calibrate", "claim1", "claim2", "fast_lr"}
    # The largest lr passes a rule that admits everything; 3 lrs x lags 1, 8 x 2 seeds were calibrated.
    assert results["lag_lr"] == 3e-4 and len(results["calibration"]) == 3
    claim2 = results["arms"]["claim2"]
    assert sorted(claim2) == sorted(
        [f"flashreinforce_delta0.003_lag{lag}_lr0.0003" for lag in (0, 2, 4, 8)]
        + [f"flashreinforce_deltainf_lag{lag}_lr0.0003" for lag in (2, 4, 8)]
        + [f"grpo_g4_lag{lag}_lr0.0003" for lag in (0, 2, 4, 8)])
    claim1 = results["arms"]["claim1"]
    flash, grpo = claim1["flashreinforce_delta0.003_lag0_lr0.0003"], claim1["grpo_g4_lag0_lr0.0003"]
    assert flash["seeds"] == grpo["seeds"] == [0, 1]
    for seed in ("0", "1"):  # paired: both arms of a seed start from the same warm-started policy
        assert flash["per_seed"][seed]["start"] == grpo["per_seed"][seed]["start"]
        assert flash["per_seed"][seed]["curve"][-1][0] == 160  # 10 updates x 16 rollouts
    assert len(list((tmp_path / "runs/warm_starts").glob("seed*.pt"))) == 2
    assert results["claim1"]["grpo_budget"] == 160 and results["claim1"]["half_budget"] == 80
    assert results["eval_noise"]["eval_size"] == 10 and len(results["eval_noise"]["policies"]) == 2
    assert results["default_job"]["seeds"] == [0, 1]
    for name in ("results.md", "results.png", "report_lag0_seed0.md"):
        assert (tmp_path / "results" / name).stat().st_size > 0, name
    assert "Claim 1" in (tmp_path / "results/results.md").read_text()

    again = _compare(tmp_path)  # every job is finished: nothing is trained again
    assert again.returncode == 0, again.stderr[-3000:]
    assert "supervised steps in" not in again.stdout
    rerun = json.loads((tmp_path / "results/results.json").read_text())
    assert rerun["arms"]["claim1"] == results["arms"]["claim1"]
