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

    assert main([str(run_dir), "--format", "csv"]) == 0
    rows = {row["row"]: row for row in _csv(capsys)}
    score = rows["score_600"]
    assert score["experiment"] == "python_tool_qwen2p5_7b"  # from the config's experiment_name
    assert score["paper_arm"].startswith("GRPO")  # from the config's algo.name
    assert float(score["this_run"]) == pytest.approx(30.0)
    assert float(score["difference"]) == pytest.approx(30.0 - 30.3, abs=1e-4)  # float32 events
