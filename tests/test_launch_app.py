"""The `molt-flashreinforce` command line end to end (dry runs; no GPU exists here): multirun
sweeps, a failing job among good ones, open `molt.*` overrides, the CPU backend's dry run, and the
child process that runs Molt keeping its log when it fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from molt_flashreinforce.app.shell import open_molt_overrides
from molt_flashreinforce.launch.job import MoltJob, run_molt_job
from molt_flashreinforce.launch.render import MoltCommand


def run_cli(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", "molt_flashreinforce", *arguments], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=300)


def job_dirs(sweep_dir: Path) -> list[Path]:
    return sorted((d for d in sweep_dir.iterdir() if d.is_dir()), key=lambda d: int(d.name.split("_")[0]))


def test_open_molt_overrides_adds_the_add_or_override_prefix():
    assert open_molt_overrides(["molt.a.b=1", "+molt.c=2", "++molt.d=3", "algo.delta=1", "~molt.e", "-m"]) == [
        "++molt.a.b=1", "+molt.c=2", "++molt.d=3", "algo.delta=1", "~molt.e", "-m"]


def test_console_script_is_installed():
    assert shutil.which("molt-flashreinforce", path=str(Path(sys.executable).parent))


def test_three_value_sweep_makes_three_run_directories(tmp_path):
    sweep = tmp_path / "sweep"
    done = run_cli(tmp_path, "-m", "experiment=math_qwen2p5_1p5b", "dry_run=true", "algo.delta=1e-3,3e-3,5e-3",
                   "molt.train.dynamic_batch_enable=true", f"hydra.sweep.dir={sweep}")
    assert done.returncode == 0, done.stderr[-3000:]
    dirs = job_dirs(sweep)
    assert [d.name for d in dirs] == [
        "0_molt.train.dynamic_batch_enable=True,algo.delta=0.001",
        "1_molt.train.dynamic_batch_enable=True,algo.delta=0.003",
        "2_molt.train.dynamic_batch_enable=True,algo.delta=0.005",
    ]
    for run_dir, delta in zip(dirs, ("0.001", "0.003", "0.005")):
        script = (run_dir / "launch" / "molt_command.sh").read_text()
        assert f"--flashreinforce.delta {delta}" in script
        assert f"--algo.advantage.is_correction_threshold {delta}" in script
        assert "--train.dynamic_batch_enable" in script
        assert f"--ckpt.path {run_dir / 'ckpt' / 'state'}" in script


def test_a_failing_job_does_not_stop_the_sweep_and_keeps_its_log(tmp_path):
    done = run_cli(tmp_path, "-m", "experiment=python_tool_qwen2p5_7b", "dry_run=true", "algo.delta=-1,1e-3")
    assert done.returncode != 0
    (sweep,) = (tmp_path / "runs" / "multirun" / "python_tool_qwen2p5_7b").iterdir()  # the default sweep dir
    failed, good = job_dirs(sweep)
    assert (good / "launch" / "molt_command.sh").is_file()
    assert not (failed / "launch").exists()
    log = (failed / "app.log").read_text()
    assert "algo.delta=-1 must be >= 0" in log


def test_tiny_dry_run_records_without_training(tmp_path):
    run_dir = tmp_path / "tiny"
    done = run_cli(tmp_path, "experiment=tiny", "dry_run=true", f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "not training" in done.stdout
    assert "backend: local" in (run_dir / "launch" / "config.yaml").read_text()
    assert not (run_dir / "launch" / "molt_command.sh").exists()
    assert not (run_dir / "summary.json").exists()


def test_help_without_an_experiment_lists_the_experiments(tmp_path):
    done = run_cli(tmp_path, "--help")
    assert done.returncode == 0
    assert "experiments: alfworld_qwen2p5_7b, long_horizon_r1_distill_1p5b, math_qwen2p5_1p5b" in done.stdout


def test_molt_runs_in_a_child_process_whose_failure_keeps_the_log(tmp_path):
    """The child is Molt's real entry point; a flag its parser refuses makes it fail in seconds."""
    job = MoltJob(run_dir=tmp_path, command=MoltCommand(flags=[("--not.a.molt.flag", ["1"])], env={}),
                  warnings=[], molt_messages="")
    with pytest.raises(RuntimeError, match="Molt exited with status 1; its output is in .*molt.log"):
        run_molt_job(job)
    assert "unrecognized arguments: --not.a.molt.flag 1" in (tmp_path / "molt.log").read_text()
