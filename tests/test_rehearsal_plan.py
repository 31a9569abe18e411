"""What `rehearsal=cpu` changes in an experiment's config (rehearsal.run.rehearsal_overrides), and
that the rehearsed job still goes through the GPU launch's own checks and Molt's parser."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from molt_flashreinforce.launch.job import prepare_molt_job
from molt_flashreinforce.rehearsal.run import rehearsal_overrides


def compose_job(*overrides: str):
    with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
        return compose(config_name="config", overrides=["rehearsal=cpu", *overrides])


def rehearsed(cfg, tmp_path: Path, total_steps: int = 4):
    changed = rehearsal_overrides(cfg, tmp_path / "model", tmp_path / "data", total_steps)
    out = cfg.copy()
    OmegaConf.set_struct(out, False)
    for key, value in changed.items():
        OmegaConf.update(out, key, value, force_add=True)
    return changed, out


def test_in_flight_rollouts_keep_the_experiments_ratio_to_the_batch(tmp_path):
    moe, _ = rehearsed(compose_job("experiment=moe_lag8_qwen3_30b_a3b"), tmp_path)
    assert moe["molt.rollout.batch_size"] == 4 and moe["molt.rollout.vllm_generate_batch_size"] == 32  # 1024/128 = 8x
    r1, _ = rehearsed(compose_job("experiment=long_horizon_r1_distill_1p5b"), tmp_path)
    assert r1["molt.rollout.vllm_generate_batch_size"] == 32  # 512/128 = 4x
    grpo, _ = rehearsed(compose_job("experiment=math_qwen2p5_1p5b", "algo=grpo"), tmp_path)
    assert grpo["molt.rollout.batch_size"] == 2 and grpo["molt.train.batch_size"] == 8  # 2 prompts x 4
    assert grpo["molt.rollout.vllm_generate_batch_size"] is None  # one batch at a time, as configured


def test_moe_keeps_expert_parallelism_and_the_rest_one_actor(tmp_path):
    moe, _ = rehearsed(compose_job("experiment=moe_lag8_qwen3_30b_a3b"), tmp_path)
    assert moe["placement.actor.ep"] == moe["placement.actor.gpus_per_node"] == 2
    assert compose_job("experiment=moe_lag8_qwen3_30b_a3b").rehearsal.steps == 6  # lag 4 needs 5+ steps
    tool, _ = rehearsed(compose_job("experiment=python_tool_qwen2p5_7b"), tmp_path)
    assert tool["placement.actor.ep"] == tool["placement.actor.gpus_per_node"] == 1


def test_only_cpu_needs_change_and_the_context_stays(tmp_path):
    cfg = compose_job("experiment=alfworld_qwen2p5_7b")
    changed, _ = rehearsed(cfg, tmp_path)
    assert "molt.data.max_len" not in changed and not any(key.startswith("algo.") for key in changed)
    assert changed["agent.max_turns"] == 3 and changed["molt.rollout.max_new_tokens"] == 24
    assert changed["molt.data.max_samples"] == 4 * 4  # 4 steps x its 4 games a step


@pytest.mark.parametrize("experiment", ["python_tool_qwen2p5_7b", "long_horizon_r1_distill_1p5b"])
def test_rehearsed_flags_pass_molts_parser_and_validation(tmp_path, experiment):
    _, cfg = rehearsed(compose_job(f"experiment={experiment}", "dry_run=true"), tmp_path)
    job = prepare_molt_job(cfg, tmp_path / "run")
    argv = job.command.argv(missing="x")
    assert argv[argv.index("--fsdp.attn_implementation") + 1] == "sdpa"
    assert argv[argv.index("--rollout.batch_size") + 1] == "8"


def test_a_rehearsal_refuses_what_the_real_model_refuses(tmp_path):
    """Without the paper's context-extended copy, Qwen2.5-Math-1.5B (4,096 positions) cannot take
    the math experiment's 6,144-token max_len: the rehearsal says so before any work, as a GPU
    launch does."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "molt_flashreinforce", "experiment=math_qwen2p5_1p5b", "rehearsal=cpu",
         "model.max_position_embeddings=null", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert "molt.data.max_len=6144 exceeds the model's context of 4096 positions" in done.stderr
    assert not (tmp_path / "run").exists()
