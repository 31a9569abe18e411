"""What `rehearsal=cpu` changes in an experiment's config (rehearsal.run.rehearsal_overrides), and
that the rehearsed job still goes through the GPU launch's own checks and Molt's parser."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from molt_flashreinforce.launch.errors import LaunchError
from molt_flashreinforce.launch.job import prepare_molt_job
from molt_flashreinforce.rehearsal.run import layout, rehearsal_overrides


def compose_job(*overrides: str):
    with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
        return compose(config_name="config", overrides=["rehearsal=cpu", *overrides])


def rehearsed(cfg, tmp_path: Path, total_steps: int = 4, nodes: int = 1):
    changed = rehearsal_overrides(cfg, tmp_path / "model", tmp_path / "data", total_steps, layout(cfg, nodes))
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
    assert compose_job("experiment=moe_lag8_qwen3_30b_a3b").rehearsal.steps == 14  # the lag target: from step 10 on
    tool, _ = rehearsed(compose_job("experiment=python_tool_qwen2p5_7b"), tmp_path)
    assert tool["placement.actor.ep"] == tool["placement.actor.gpus_per_node"] == 1


def test_only_cpu_needs_change_and_the_context_stays(tmp_path):
    cfg = compose_job("experiment=alfworld_qwen2p5_7b")
    changed, _ = rehearsed(cfg, tmp_path)
    assert "molt.data.max_len" not in changed and not any(key.startswith("algo.") for key in changed)
    assert changed["agent.max_turns"] == 3 and changed["molt.rollout.max_new_tokens"] == 24
    assert changed["molt.data.max_samples"] == 4 * 4  # 4 steps x its 4 games a step


def test_on_several_nodes_the_actor_and_the_engines_get_nodes_of_their_own(tmp_path):
    """One logical GPU per node: the actor's ranks on placement.actor.nodes nodes, an engine on each other."""
    math, _ = rehearsed(compose_job("experiment=math_qwen2p5_1p5b"), tmp_path, nodes=2)  # gpu16_actor2_vllm14
    assert (math["placement.nodes"], math["placement.gpus_per_node"]) == (2, 1)
    assert (math["placement.actor.nodes"], math["placement.actor.gpus_per_node"], math["placement.vllm.engines"]) == (1, 1, 1)
    moe, _ = rehearsed(compose_job("experiment=moe_lag8_qwen3_30b_a3b"), tmp_path, nodes=4)  # actor on 2 of 4 nodes
    assert (moe["placement.actor.nodes"], moe["placement.actor.gpus_per_node"], moe["placement.actor.ep"]) == (2, 1, 2)
    assert moe["placement.vllm.engines"] == 2
    assert moe["molt.train.micro_batch_size"] == 1  # 4 trajectories, two micro-batches on each of 2 ranks
    three, _ = rehearsed(compose_job("experiment=moe_lag8_qwen3_30b_a3b"), tmp_path, nodes=3)
    assert (three["placement.actor.nodes"], three["placement.vllm.engines"]) == (2, 1)


@pytest.mark.parametrize("experiment, nodes, message", [
    ("moe_lag8_qwen3_30b_a3b", 2, "rehearse on 3 to 4 nodes, or on one"),  # EP spans 2 nodes, engines need a third
    ("math_qwen2p5_1p5b", 3, "placement.nodes=2 with the actor on placement.actor.nodes=1 and the engines on the others, "
                             "so rehearse on 2 nodes, or on one"),
])
def test_a_node_count_the_placement_cannot_spread_over_is_refused_in_one_line(experiment, nodes, message):
    with pytest.raises(LaunchError, match=message) as refused:
        layout(compose_job(f"experiment={experiment}"), nodes)
    assert str(refused.value).startswith(f"rehearsal=cpu on {nodes} nodes: ") and "\n" not in str(refused.value)


@pytest.mark.parametrize("experiment, nodes, prompts", [("python_tool_qwen2p5_7b", 1, 4), ("long_horizon_r1_distill_1p5b", 1, 8),
                                                        ("moe_lag8_qwen3_30b_a3b", 4, 4)])
def test_rehearsed_flags_pass_molts_parser_and_validation(tmp_path, experiment, nodes, prompts):
    _, cfg = rehearsed(compose_job(f"experiment={experiment}", "dry_run=true"), tmp_path, nodes=nodes)
    job = prepare_molt_job(cfg, tmp_path / "run")
    argv = job.command.argv(missing="x")
    assert argv[argv.index("--fsdp.attn_implementation") + 1] == "sdpa"
    assert argv[argv.index("--rollout.batch_size") + 1] == str(prompts)
    assert ("--eval.eval_at_start" in argv) == bool(cfg.rehearsal.eval_at_start)  # off for the tool and the MoE


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


def test_the_engine_is_vllm_unless_the_experiment_says_why_not(capsys):
    from molt_flashreinforce.rehearsal.run import check_engine

    assert check_engine(compose_job("experiment=math_qwen2p5_1p5b")) == "vllm"
    assert capsys.readouterr().out == ""
    assert check_engine(compose_job("experiment=moe_lag8_qwen3_30b_a3b")) == "standin"
    (line,) = capsys.readouterr().out.splitlines()
    assert line == ("rehearsal.engine=standin: the rollout engine is the package's HF stand-in, not vLLM: "
                    "the refit check's reference does not take MoE experts yet, and two vLLM engines beside four "
                    "trainer nodes are not yet measured on 24 GB")
    check_engine(compose_job("experiment=math_qwen2p5_1p5b", "rehearsal.engine=standin"))
    assert capsys.readouterr().out.splitlines() == [
        "rehearsal.engine=standin: the rollout engine is the package's HF stand-in, not vLLM: chosen in the "
        "rehearsal's config or on the command line"]


def test_an_engine_that_cannot_run_is_refused_in_one_line_before_any_work(tmp_path, monkeypatch):
    from molt_flashreinforce.evaluation import engine as evaluation_engine
    from molt_flashreinforce.rehearsal.run import run_rehearsal

    with pytest.raises(LaunchError) as unknown:
        run_rehearsal(compose_job("experiment=math_qwen2p5_1p5b", "rehearsal.engine=hf"), tmp_path / "run")
    assert str(unknown.value) == ("rehearsal.engine=hf: use rehearsal.engine=vllm (Molt's engine actor on vLLM's CPU "
                                  "build) or rehearsal.engine=standin (the package's HF stand-in)")
    monkeypatch.setattr(evaluation_engine, "vllm_version", lambda: None)  # as where scripts/setup_vllm.sh never ran
    with pytest.raises(LaunchError) as absent:
        run_rehearsal(compose_job("experiment=math_qwen2p5_1p5b"), tmp_path / "run")
    assert str(absent.value) == ("rehearsal.engine=vllm needs vLLM's CPU build, which is not installed: run "
                                 "`bash scripts/setup_vllm.sh`, or rehearse with the stand-in engine "
                                 "(rehearsal.engine=standin)")
    assert not (tmp_path / "run").exists()  # nothing was built
