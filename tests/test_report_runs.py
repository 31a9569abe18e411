"""The report on run directories made by this package's own commands.

`molt-flashreinforce ... dry_run=true` writes a real run directory from the package's primary
config (its `.hydra/` records) without training; the Molt run that would follow cannot start
here (no GPU, no vLLM), so its TensorBoard events are written with torch's `SummaryWriter`
under Molt's layout (`<run_dir>/tensorboard/<run_name>/`). The local-backend test trains the
tiny experiment for real, briefly.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys

import pytest
from torch.utils.tensorboard import SummaryWriter

from molt_flashreinforce import metrics
from molt_flashreinforce.report.cli import main


def _csv(capsys) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(capsys.readouterr().out)))


def test_dry_run_directory_of_the_real_config(tmp_path, capsys):
    run_dir = tmp_path / "run"
    subprocess.run(
        [sys.executable, "-m", "molt_flashreinforce", "experiment=python_tool_qwen2p5_7b", "algo=grpo",
         "dry_run=true", f"hydra.run.dir={run_dir}"],
        check=True, capture_output=True, cwd=tmp_path,
    )
    writer = SummaryWriter(log_dir=str(run_dir / "tensorboard" / "python_tool_qwen2p5_7b_grpo"))
    for task, accuracy in (("amc23", 0.6), ("minerva", 0.3), ("aime25", 0.0)):
        writer.add_scalar(metrics.eval_pass1(task), accuracy, 600)
    writer.add_scalar(metrics.TOOL_CALLS, 0.0, 600)
    writer.close()

    assert main([str(run_dir), "--format", "csv", "--view", "compare"]) == 0
    rows = {row["row"]: row for row in _csv(capsys)}
    score = rows["score_600"]
    assert score["experiment"] == "python_tool_qwen2p5_7b"  # from the config's experiment_name
    assert score["paper_arm"].startswith("GRPO")  # from the config's algo.name
    assert float(score["this_run"]) == pytest.approx(30.0)
    assert float(score["difference"]) == pytest.approx(30.0 - 30.3, abs=1e-4)  # float32 events


TINY_SHORT = ["local.steps=4", "local.warm_start.steps=5", "local.eval.every=2", "local.rollouts_per_step=16",
              "local.task.eval_size=32", "local.checkpoint.every=4", "local.progress_bar=false"]


@pytest.mark.slow
def test_tiny_local_backend_sweep_becomes_a_table_and_a_plot(tmp_path, capsys):
    """A real, short `molt-flashreinforce -m experiment=tiny algo=flashreinforce,grpo` on the CPU."""
    sweep = tmp_path / "sweep"
    subprocess.run(
        [sys.executable, "-m", "molt_flashreinforce", "-m", "experiment=tiny", "algo=flashreinforce,grpo",
         *TINY_SHORT, f"hydra.sweep.dir={sweep}"],
        check=True, capture_output=True, cwd=tmp_path,
    )
    png = tmp_path / "tiny.png"
    assert main([str(sweep), "--format", "csv", "--view", "compare", "--plot", str(png)]) == 0
    rows = _csv(capsys)
    assert [(row["run"], row["row"]) for row in rows] == [
        ("algo=flashreinforce", "final"), ("algo=flashreinforce", "peak"), ("algo=grpo", "final"), ("algo=grpo", "peak"),
    ]
    for row in rows:
        assert row["experiment"] == "tiny" and row["paper"] == "" and row["status"] == ""
        assert 0.0 <= float(row["this_run"]) <= 100.0
    finals = [row for row in rows if row["row"] == "final"]
    # 4 updates of 16 trajectories each, whatever the algorithm (GRPO: 4 prompts x 4).
    assert [(int(row["step_used"]), float(row["rollouts"])) for row in finals] == [(4, 64.0), (4, 64.0)]
    assert [row["paper_arm"] for row in finals] == ["FlashREINFORCE", "GRPO"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
