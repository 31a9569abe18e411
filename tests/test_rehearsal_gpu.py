"""`rehearsal=gpu` (rehearsal.gpu): its overrides, its refusal on a machine without CUDA, and its
rendering: no stand-in reaches the Molt process it would start.

This machine has no GPU, so the run itself is not started here: the rendering test stops at the
point where the launcher would start Molt (`start_molt_job`, replaced to capture the job) and
skips the node check, which the refusal test covers on its own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from molt_flashreinforce.launch import job as launch_job
from molt_flashreinforce.launch.render import MOLT_ENTRY_MODULE
from molt_flashreinforce.rehearsal import gpu, run, standins
from molt_flashreinforce.rehearsal.run import LOGICAL_GPUS_VARIABLE, layout, rehearsal_overrides


def compose_job(mode: str, *overrides: str):
    with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
        return compose(config_name="config", overrides=[f"rehearsal={mode}", *overrides])


@pytest.mark.parametrize("experiment, gpus", [("python_tool_qwen2p5_7b", 2), ("moe_lag8_qwen3_30b_a3b", 3)])
def test_same_overrides_as_cpu_but_cuda_attention_and_one_node(tmp_path, experiment, gpus):
    cpu_cfg, gpu_cfg = compose_job("cpu", f"experiment={experiment}"), compose_job("gpu", f"experiment={experiment}")
    as_dict = lambda node: OmegaConf.to_container(node)  # noqa: E731
    cpu_only = ("engine", "standin_reason")  # which engine rehearsal=cpu runs; rehearsal=gpu runs vLLM on its GPUs
    on_cpu_settings = {key: value for key, value in as_dict(cpu_cfg.rehearsal).items() if key not in cpu_only}
    on_gpu_settings = {key: value for key, value in as_dict(gpu_cfg.rehearsal).items() if key not in cpu_only}
    assert on_gpu_settings == {**on_cpu_settings, "mode": "gpu"}  # steps: the experiment's own
    on_cpu = rehearsal_overrides(cpu_cfg, tmp_path / "model", tmp_path / "data", 6, layout(cpu_cfg, 1))
    on_gpu = gpu.node_overrides(gpu_cfg, rehearsal_overrides(gpu_cfg, tmp_path / "model", tmp_path / "data", 6,
                                                             layout(gpu_cfg, 1)))
    placement = {key for key in on_gpu if key.startswith("placement.")}
    # Everything but the placement and the two CUDA-less settings is the CPU rehearsal's.
    assert {k: v for k, v in on_gpu.items() if k not in placement} == {
        k: v for k, v in on_cpu.items() if k not in placement and k not in gpu.CPU_ONLY_KEYS}
    assert not set(gpu.CPU_ONLY_KEYS) & set(on_gpu)  # the experiment's flash-attention 2 and packing
    assert on_gpu["molt.train.check_weight_update_equal"] is True and on_gpu["molt.ckpt.save_steps"] == gpu_cfg.rehearsal.steps
    assert on_gpu["placement.nodes"] == 1 and on_gpu["placement.vllm.engines"] == 1
    assert on_gpu["placement.actor.gpus_per_node"] + on_gpu["placement.vllm.engines"] == gpus == gpu.gpus_needed(gpu_cfg)
    assert on_gpu["placement.actor.ep"] == gpus - 1  # the MoE keeps EP 2, the rest one policy GPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_refuses_in_one_line_pointing_to_rehearsal_cpu(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "molt_flashreinforce", "experiment=math_qwen2p5_1p5b", "rehearsal=gpu",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith("molt-flashreinforce: error: rehearsal=gpu runs on CUDA GPUs")
    assert "use rehearsal=cpu" in lines[0]
    assert not (tmp_path / "run").exists()  # refused before any work


class LaunchReached(Exception):
    pass


@pytest.mark.parametrize("experiment", ["python_tool_qwen2p5_7b", "moe_lag8_qwen3_30b_a3b"])
def test_no_standin_reaches_the_molt_process(tmp_path, monkeypatch, experiment):
    launched = {}

    def capture(job, extra_env=None, module=MOLT_ENTRY_MODULE):
        launched.update(job=job, module=module, env={**job.command.env, **(extra_env or {})})
        raise LaunchReached

    monkeypatch.setattr(gpu, "check_node", lambda cfg: None)  # no GPU here; refusal tested above
    monkeypatch.setattr(launch_job, "start_molt_job", capture)
    monkeypatch.chdir(tmp_path)
    cfg = compose_job("gpu", f"experiment={experiment}")
    with pytest.raises(LaunchReached):
        run.run_rehearsal(cfg, tmp_path / "run")

    # Molt's own entry point: Ray workers get the plugin's setup hook, not the stand-ins' hook.
    assert launched["module"] == MOLT_ENTRY_MODULE != run.DRIVER_MODULE
    env = launched["env"]
    assert LOGICAL_GPUS_VARIABLE not in env and "PYTHONPATH" not in env  # no vllm_standin, no logical GPUs
    assert not set(standins.ENVIRONMENT) & set(env)  # the real MoE token dispatcher
    assert "GLOO_SOCKET_IFNAME" not in env and env["HF_HUB_OFFLINE"] == "1"
    command = launched["job"].command
    argv = command.argv(missing="x")
    script = (tmp_path / "run" / "launch" / "molt_command.sh").read_text()
    assert standins.SETUP_HOOK not in script and "vllm_standin" not in script
    flag = lambda name: argv[argv.index(name) + 1]  # noqa: E731
    assert flag("--vllm.sync_backend") == "nccl" and flag("--fsdp.attn_implementation") == "flash_attention_2"
    assert "--fsdp.packing_samples" in argv and "--train.check_weight_update_equal" in argv
    assert flag("--vllm.num_engines") == "1" and flag("--actor.num_gpus_per_node") == str(gpu.gpus_needed(cfg) - 1)


def test_the_summary_has_vllm_kl_and_the_weight_check_and_no_standin(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from molt_flashreinforce import metrics
    from molt_flashreinforce.cluster.supervisor import History

    writer = SummaryWriter(str(tmp_path / "tensorboard"))
    for step, (kl, consumed) in enumerate([(2e-4, 8.0), (5e-3, 16.0)], start=1):
        writer.add_scalar(metrics.VLLM_KL, kl, step)
        writer.add_scalar(metrics.ROLLOUTS_CONSUMED, consumed, step)
    writer.close()
    log = "INFO [check_weight_update] the broadcast landed on every vLLM weight\n"  # Molt 0.2.1's line
    one_attempt = History(attempts=1, restarts=0, requeues=0, resumed_from=(0,))
    summary = run.summarize(compose_job("gpu", "experiment=python_tool_qwen2p5_7b"), tmp_path, one_attempt, log, {})
    assert summary.standins == {} and summary.real == run.REAL_PARTS + gpu.REAL_PARTS
    assert summary.vllm_kl_first_step == pytest.approx(2e-4) and summary.steps == 2
    lines = summary.lines()
    assert "  stand-ins: none" in lines and any("weight check landed 1/1" in line for line in lines)
    on_cpu = run.summarize(compose_job("cpu", "experiment=python_tool_qwen2p5_7b"), tmp_path, one_attempt, log, {})
    assert on_cpu.standins == {**standins.ENGINE_STANDINS["vllm"], **standins.STANDINS,
                               standins.FLOAT32_STANDIN[0]: standins.FLOAT32_STANDIN[1]}
    assert on_cpu.real == run.REAL_PARTS + standins.VLLM_REAL_PARTS and on_cpu.engine == "vllm"
    assert "  rollout engine: vLLM (Molt's RolloutRayActor)" in on_cpu.lines()
    # The MoE keeps the stand-in engine (its config says why) and its bf16 (rehearsal.float32: false).
    moe = run.summarize(compose_job("cpu", "experiment=moe_lag8_qwen3_30b_a3b"), tmp_path, one_attempt, log, {})
    assert moe.standins == {**standins.ENGINE_STANDINS["standin"], **standins.STANDINS}
    assert moe.real == run.REAL_PARTS and moe.engine == "standin"
    assert "  rollout engine: the HF stand-in (rehearsal.engine.CpuRolloutEngine)" in moe.lines()


def test_a_multi_node_allocation_is_refused_in_one_line(tmp_path):
    from molt_flashreinforce.cluster.slurm import Allocation
    from molt_flashreinforce.launch.errors import LaunchError

    two_nodes = Allocation(job_id="5", nodes=("n1", "n2"), this_node="n1", head_address="127.0.0.1")
    with pytest.raises(LaunchError, match=r"rehearsal=gpu runs on the GPUs of one node, but this allocation has 2; "
                                          r"submit it with --nodes=1"):
        run.run_rehearsal(compose_job("gpu", "experiment=math_qwen2p5_1p5b"), tmp_path / "run", two_nodes)
    assert not (tmp_path / "run").exists()  # refused before any work
