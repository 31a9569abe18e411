"""CPU rehearsals (`rehearsal=cpu`) of every paper experiment through Molt's real async runtime.

Each test runs the real command line in a child process: Molt's unmodified `train(args)` with
its actors, queue, router, FSDP2 actor, refits and checkpointing, this plugin in every worker,
and the experiment's own agent file, data format and reward. Only the stand-ins listed in
`rehearsal.standins.STANDINS` replace what this CPU cannot run (vLLM's engine, NCCL, CUDA).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from molt_flashreinforce import metrics
from molt_flashreinforce.launch.job import latest_checkpoint
from molt_flashreinforce.rehearsal.run import SUMMARY_NAME, WORK_SUBDIR
from molt_flashreinforce.rehearsal.standins import STANDINS
from molt_flashreinforce.report.events import read_scalars

pytestmark = pytest.mark.slow

REHEARSALS = {
    "math": ["experiment=math_qwen2p5_1p5b"],
    "tool": ["experiment=python_tool_qwen2p5_7b"],
    "moe": ["experiment=moe_lag8_qwen3_30b_a3b"],
    "alfworld": ["experiment=alfworld_qwen2p5_7b"],
    "r1": ["experiment=long_horizon_r1_distill_1p5b"],
    "math_grpo": ["experiment=math_qwen2p5_1p5b", "algo=grpo"],
}
TRAJECTORIES_PER_STEP = 8  # rehearsal/cpu.yaml
PER_STEP = {"alfworld": 4, "moe": 4}  # the experiments' own rehearsal.trajectories_per_step


def rehearse(workdir: Path, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "molt_flashreinforce", *overrides, "rehearsal=cpu", f"hydra.run.dir={run_dir}"]
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"{' '.join(overrides)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done


@pytest.fixture(scope="module")
def rehearsals(tmp_path_factory):
    """Each rehearsal runs once, on first use: name -> (run dir, stdout)."""
    root = tmp_path_factory.mktemp("rehearsals")
    done: dict[str, tuple[Path, str]] = {}

    def get(name: str) -> tuple[Path, str]:
        if name not in done:
            run_dir = root / name / "first"
            done[name] = (run_dir, rehearse(root, run_dir, *REHEARSALS[name]).stdout)
        return done[name]

    return get


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / WORK_SUBDIR / SUMMARY_NAME).read_text())


def check_rehearsal(run_dir: Path, stdout: str, steps: int, min_lag: int, per_step: int = TRAJECTORIES_PER_STEP,
                    sampled_log_probs: bool = True) -> dict:
    summary = summary_of(run_dir)
    scalars = read_scalars(run_dir / "tensorboard")
    assert summary["steps"] == steps
    # The policy-lag probe reaches Molt's TrainingActor (a class @ray.remote captured before the
    # plugin's patch): its tags are in the real run's TensorBoard log.
    lag_max = [value for _, value in scalars[metrics.POLICY_LAG_MAX]]
    assert len(lag_max) == steps and max(lag_max) >= min_lag
    assert len(scalars[metrics.POLICY_VERSIONS_MIXED]) == steps
    consumed = [value for _, value in scalars[metrics.ROLLOUTS_CONSUMED]]
    assert consumed == [float(per_step * (i + 1)) for i in range(steps)]
    # The engine is honest: the trainer's recomputed log-probs match the sampled ones at step 1
    # (Molt keeps the sampling log-probs, and logs vllm_kl, only with an importance correction),
    # and every refit reached every engine weight (--train.check_weight_update_equal).
    if sampled_log_probs:
        assert abs(scalars[metrics.VLLM_KL][0][1]) < 1e-3
    else:
        assert metrics.VLLM_KL not in scalars
    assert len(summary["weight_checks"]) == steps
    assert all("landed on every vLLM weight" in line for line in summary["weight_checks"])
    assert latest_checkpoint(run_dir) is not None  # Molt's own checkpointing
    for name in STANDINS:
        assert name in stdout
    return scalars


@pytest.mark.parametrize("name, min_lag", [("math", 1), ("tool", 1), ("r1", 1), ("alfworld", 1)])
def test_flashreinforce_rehearsal(rehearsals, name, min_lag):
    run_dir, stdout = rehearsals(name)
    scalars = check_rehearsal(run_dir, stdout, steps=4, min_lag=min_lag, per_step=PER_STEP.get(name, TRAJECTORIES_PER_STEP))
    acceptance = [value for _, value in scalars[metrics.ACCEPTANCE_RATE]]
    assert len(acceptance) == 4 and all(0.0 <= a <= 1.0 for a in acceptance)


def test_moe_rehearsal_keeps_the_lag_8_queue_structure(rehearsals):
    run_dir, stdout = rehearsals("moe")
    check_rehearsal(run_dir, stdout, steps=6, min_lag=4, per_step=PER_STEP["moe"])


def test_grpo_rehearsal(rehearsals):
    run_dir, stdout = rehearsals("math_grpo")
    scalars = check_rehearsal(run_dir, stdout, steps=4, min_lag=1, sampled_log_probs=False)  # GRPO: IS off
    assert metrics.ACCEPTANCE_RATE not in scalars  # stock Molt GRPO: no trust region of ours


@pytest.mark.parametrize("name", ["tool", "alfworld"])
def test_multi_turn_batches_count_trajectories(rehearsals, name):
    """B in the baseline and the sample mean counts trajectories: Molt's StepEnvRunner keeps a
    multi-turn trajectory as one sample, so samples = rollouts = trajectories per step."""
    run_dir, _ = rehearsals(name)
    scalars = read_scalars(run_dir / "tensorboard")
    for tag in ("train/rollout/num_samples", "train/rollout/num_rollouts"):
        assert {value for _, value in scalars[tag]} == {float(PER_STEP.get(name, TRAJECTORIES_PER_STEP))}
    if name == "alfworld":
        assert max(value for _, value in scalars[metrics.TURNS]) > 1  # several turns per trajectory


def test_resume_continues_from_molts_checkpoint(rehearsals, tmp_path_factory):
    first, _ = rehearsals("tool")
    before = summary_of(first)
    rehearse(first.parents[1], first.parent / "second", *REHEARSALS["tool"], "rehearsal.resume=true")
    after = summary_of(first)  # the resumed rehearsal continues in the first one's run directory
    assert after["resumed_from_step"] == before["steps"] == 4 and after["steps"] == 4
    consumed = [value for _, value in read_scalars(first / "tensorboard")[metrics.ROLLOUTS_CONSUMED]]
    assert consumed[-1] == 8 * TRAJECTORIES_PER_STEP
    assert not (first.parent / "second").exists()


def test_report_reads_a_rehearsal(rehearsals, capsys):
    from molt_flashreinforce.report.cli import main as report

    run_dir, _ = rehearsals("math")
    assert report([str(run_dir)]) == 0
    assert "math" in capsys.readouterr().out
