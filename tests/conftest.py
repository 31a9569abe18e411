"""Shared fixtures: a real SLURM cluster of several nodes on this host (scripts/local_slurm.sh), and
the eval command's inputs (`eval_inputs`).

`slurm` starts it on first use (a private munged, slurmctld and one slurmd per node n1..n4) and
stops it when the session ends. It needs Debian's slurm-wlm and munge (scripts/setup_slurm.sh
installs them where the tests run as root with apt-get, as CI does) and root (slurmd runs jobs as
their user); elsewhere the tests that use it skip and say why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SBIN = "/usr/sbin"
NODES = 4  # the MoE placement's node count; every node shares this host's cores
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")


def slurm_missing() -> str | None:
    absent = [p for p in PROGRAMS if shutil.which(p, path=f"{os.environ.get('PATH', '')}:{SBIN}") is None]
    if absent:
        return (f"SLURM is not installed here ({', '.join(absent)} missing); scripts/setup_slurm.sh installs "
                "Debian's slurm-wlm and munge where the tests run as root with apt-get")
    if os.geteuid() != 0:
        return "the local SLURM cluster runs slurmd as root (it starts jobs as their user); run the tests as root"
    return None


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """Environment for SLURM's clients against the running cluster of NODES nodes."""
    reason = slurm_missing()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm")
    script = str(REPO / "scripts" / "local_slurm.sh")
    up = subprocess.run(["bash", script, "up", str(root), str(NODES)], capture_output=True, text=True, timeout=120)
    if up.returncode != 0:
        pytest.fail(f"the local SLURM cluster did not start:\n{up.stdout}\n{up.stderr}")
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}:{SBIN}"}
    try:
        yield env
    finally:
        subprocess.run(["bash", script, "down", str(root)], timeout=120)


def nodes_out_of_service(env: dict[str, str]) -> list[str]:
    """'node state reason' of each node of the local cluster that SLURM drained or marked down."""
    shown = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T %E"], env=env, capture_output=True, text=True, timeout=30)
    return [line for line in shown.stdout.splitlines() if any(s in line.split()[1] for s in ("drain", "down", "fail"))]


@pytest.fixture(autouse=True)
def slurm_nodes_back_in_service(request):
    """After each test on the local cluster, a node SLURM drained or marked down (most often a
    process that outlived its job: "Kill task failed") is named in a warning and resumed, so that
    the tests after it find every node (a drained node left a later sweep pending)."""
    yield
    if "slurm" not in request.fixturenames:
        return
    env = request.getfixturevalue("slurm")
    for line in nodes_out_of_service(env):
        node = line.split()[0]
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=env, capture_output=True, timeout=30)
        request.node.warn(pytest.PytestWarning(f"SLURM node out of service after this test, resumed: {line}"))


# ── the eval command's inputs (tests/test_eval_command.py, tests/test_eval_engine.py) ──

FIXTURE_DATA = Path(__file__).parent / "fixtures" / "data"
EVAL_SOURCES = {
    "math_qwen2p5_1p5b": {"dapo": "dapo.jsonl", "math500": "math500.parquet", "amc23": "amc23.json",
                          "minerva": "minerva.jsonl", "aime25": "aime25.jsonl", "olympiadbench": "olympiadbench.jsonl"},
    "python_tool_qwen2p5_7b": {"dapo": "dapo.jsonl", "amc23": "amc23.json", "minerva": "minerva.jsonl",
                               "aime25": "aime25.jsonl"},
}


class EvalInputs:
    @staticmethod
    def compose_experiment(name: str, *overrides: str):
        from hydra import compose, initialize_config_module
        from omegaconf import OmegaConf

        with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"experiment={name}", *overrides])
        OmegaConf.resolve(cfg)
        return cfg

    @staticmethod
    def write_data(experiment: str, out: Path) -> Path:
        """The data command's eval (and train) files from the shipped source fixtures."""
        from molt_flashreinforce.data.cli import main as data_main

        argv = [experiment, "--out", str(out)]
        for name, file in EVAL_SOURCES[experiment].items():
            argv += ["--source", f"{name}={FIXTURE_DATA / file}"]
        assert data_main(argv) == 0
        return out

    @staticmethod
    def save_molt_checkpoint(model_dir: Path, run_dir: Path, step: int) -> Path:
        """What Molt's actor writes at `global_step{step}` (one FSDP rank), written by Molt's own
        CheckpointManager through NeMo AutoModel's checkpointer."""
        from types import SimpleNamespace

        import torch
        import torch.distributed as dist
        from molt.trainer.fsdp.checkpoint import CheckpointManager
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
        strategy = SimpleNamespace(_unwrap_model=lambda m: m, param_dtype="bf16", moe_mesh=None,
                                   _get_dp_rank=lambda include_cp=True: 0, _get_automodel_rank=lambda name: 0)
        actor = run_dir / "ckpt" / "state" / "_actor"
        dist.init_process_group("gloo", init_method=f"file://{run_dir / 'process_group'}", rank=0, world_size=1)
        try:
            CheckpointManager(strategy).save_ckpt(model, str(actor), f"global_step{step}",
                                                  client_states={"global_step": step})
        finally:
            dist.destroy_process_group()
        return actor / f"global_step{step}"

    @staticmethod
    def write_run_config(run_dir: Path, experiment: str, model_dir: Path, data_dir: Path, algo: str) -> None:
        """The `.hydra/config.yaml` a training run of `experiment` on `model_dir` leaves."""
        from omegaconf import OmegaConf

        cfg = EvalInputs.compose_experiment(experiment, f"algo={algo}", f"model.name_or_path={model_dir}",
                                            f"data.dir={data_dir}")
        (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
        (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))


    @staticmethod
    def evaluate(argv: list, warm_cache: Path, timeout_s: float = 600) -> subprocess.CompletedProcess:
        """`molt-flashreinforce-eval ARGV --device cpu` in its own process (vLLM's CPU build)."""
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(warm_cache)}
        return subprocess.run([sys.executable, "-m", "molt_flashreinforce.evaluation.cli", *map(str, argv), "--device", "cpu"],
                              env=env, capture_output=True, text=True, timeout=timeout_s)

    @staticmethod
    def check_eval_dir(out: Path, step: int, samples: int) -> tuple[object, list[dict]]:
        """What eval_record specifies, and every number recomputed from the samples."""
        import json

        from molt_flashreinforce import metrics
        from molt_flashreinforce.eval_record import SAMPLE_KEYS, read_record
        from molt_flashreinforce.report.events import read_scalars

        record = read_record(out)
        lines = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
        assert record.complete and len(lines) == samples
        assert all(set(SAMPLE_KEYS) <= set(line) and line["reward"] in (0.0, 1.0) and line["response"] for line in lines)
        k = record.protocol.avg_at_k
        scalars = read_scalars(out)
        for name, score in record.benchmarks.items():
            mine = [line for line in lines if line["benchmark"] == name]
            problems = sorted({line["problem_id"] for line in mine})
            assert score.samples == len(mine) == k * len(problems) and score.problems == len(problems)
            per_problem = [sum(line["reward"] for line in mine if line["problem_id"] == p) / k for p in problems]
            assert score.avg == pytest.approx(sum(per_problem) / len(per_problem))
            assert scalars[metrics.eval_pass1(name)] == ((step, pytest.approx(score.avg)),)
        return record, lines


@pytest.fixture(scope="session")
def eval_inputs():
    return EvalInputs


@pytest.fixture(scope="session")
def warm_compile_cache(tmp_path_factory):
    """One TORCHINDUCTOR_CACHE_DIR for every vLLM engine the tests start: its log-prob op compiles once."""
    return tmp_path_factory.mktemp("inductor")
