"""`rehearsal=cpu`: an experiment's exact Molt job, run for a few steps through Molt's real
async runtime on this machine's CPU.

    run_rehearsal(cfg, run_dir) -> Summary

The rehearsal composes the experiment's own config, changes only what a CPU needs
(`rehearsal_overrides`: a tiny model with the paper model's shape card, small data the project
generates in the experiment's own format, one policy actor and one engine on logical Ray GPUs,
sdpa attention without packing, small batches and short generations, `rehearsal.steps`
optimizer steps, a checkpoint at the end), then goes through the same `prepare_molt_job` path
as a GPU launch (checks, rendering, Molt's parser and validation, run records) and runs Molt's
`train(args)` in a child process (`rehearsal.driver`) with the stand-ins of `standins.STANDINS`.
The experiment's agent file, reward and async queue structure are kept; in-flight rollouts
scale with the batch, so the queue's lag structure survives the shrink.

`rehearsal=gpu` runs the same job on the GPUs of one node with no stand-in: what differs is in
`rehearsal.gpu` (the node check, the one-node placement, the real launch).

Resuming: rerunning in a run directory that holds a Molt checkpoint continues from it (the
launcher adds `--ckpt.load_enable`); `rehearsal.resume=true` continues the newest rehearsal of
the same experiment and algo. Either way `rehearsal.steps` more steps are trained.
`dry_run=true` builds the model and data and validates the job, without starting Ray.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from molt_flashreinforce import metrics
from molt_flashreinforce.launch import model_context
from molt_flashreinforce.launch.errors import LaunchError

DRIVER_MODULE = "molt_flashreinforce.rehearsal.driver"
WORK_SUBDIR = "rehearsal"
SUMMARY_NAME = "summary.json"
STEP_FILE = "steps_done.json"
LOGICAL_GPUS_VARIABLE = "MOLT_FLASHREINFORCE_REHEARSAL_GPUS"
_WEIGHT_CHECK = re.compile(r"\[check_weight_update\] (.+)")


@dataclass
class Summary:
    experiment: str
    algo: str
    steps: int
    rollouts_consumed: float | None
    policy_lag_mean: float | None
    policy_lag_max: float | None
    versions_mixed_fraction: float | None
    acceptance_rate: float | None
    reward_mean: float | None
    vllm_kl_first_step: float | None
    weight_checks: list[str]
    resumed_from_step: int
    standins: dict[str, str]
    real: list[str]
    phases_s: dict[str, float] = field(default_factory=dict)

    def lines(self) -> list[str]:
        def fmt(value, digits=3):
            return "n/a" if value is None else f"{value:.{digits}g}" if isinstance(value, float) else str(value)

        landed = sum("landed on every vLLM weight" in line for line in self.weight_checks)
        out = [
            f"rehearsal {self.experiment} algo={self.algo}: {self.steps} optimizer steps"
            + (f" (resumed at step {self.resumed_from_step})" if self.resumed_from_step else ""),
            f"  rollouts consumed {fmt(self.rollouts_consumed)}; policy lag mean {fmt(self.policy_lag_mean)} "
            f"max {fmt(self.policy_lag_max)}; trajectories spanning a refit {fmt(self.versions_mixed_fraction)}",
            f"  acceptance rate {fmt(self.acceptance_rate)}; reward mean {fmt(self.reward_mean)}; "
            f"vllm_kl at the first step {fmt(self.vllm_kl_first_step)}; weight check landed {landed}/{len(self.weight_checks)}",
            "  ran for real: " + ", ".join(self.real),
            "  stand-ins: " + ("; ".join(f"{name} ({what})" for name, what in self.standins.items()) or "none"),
            "  wall time: " + ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in self.phases_s.items()),
        ]
        return out


REAL_PARTS = [
    "Molt's driver train(args) and its validation",
    "RLTrainer, GenerateSamplesActor, TrainingActor (async queue, partial rollout, refit)",
    "AgentRunnerActor + StepEnvRunner over HTTP through the Rust vllm-router",
    "PolicyModelActor with FSDP2 (nemo_automodel) and Molt's checkpointing",
    "the experiment's agent file and reward",
    "this plugin's estimator, loss and policy-lag probe",
]


def _set(cfg: DictConfig, key: str, value) -> None:
    OmegaConf.update(cfg, key, value, force_add=True)


def _scaled_in_flight(molt_rollout: DictConfig, prompts: int) -> int | None:
    """In-flight rollouts at the same ratio to the batch as the experiment's."""
    in_flight = molt_rollout.get("vllm_generate_batch_size")
    if in_flight is None:
        return None
    return max(1, round(int(in_flight) * prompts / int(molt_rollout.batch_size)))


def prompts_per_step(cfg: DictConfig) -> int:
    return max(1, int(cfg.rehearsal.trajectories_per_step) // int(cfg.algo.group_size))


def rehearsal_overrides(cfg: DictConfig, model_dir: Path, data_dir: Path, total_steps: int) -> dict[str, object]:
    """Every key the rehearsal changes, with its new value."""
    rehearsal = cfg.rehearsal
    prompts = prompts_per_step(cfg)
    trajectories = prompts * int(cfg.algo.group_size)
    molt = cfg.molt
    # Molt builds MoE models only with expert parallelism, so an EP experiment keeps EP 2 (two
    # FSDP ranks over gloo); every other one gets a single policy actor.
    expert_parallel = 2 if int(cfg.placement.actor.ep) > 1 else 1
    micro_batch = max(1, trajectories // (2 * expert_parallel))  # two micro-batches: accumulation runs
    overrides: dict[str, object] = {
        "model.name_or_path": str(model_dir),
        "model.dir": str(model_dir.parent / "models"),
        "data.dir": str(data_dir),
        "placement.actor.nodes": 1,
        "placement.actor.gpus_per_node": expert_parallel,
        "placement.actor.tp": 1,
        "placement.actor.ep": expert_parallel,
        "placement.actor.cp": 1,
        "placement.vllm.engines": 1,
        "placement.vllm.tp": 1,
        "agent.max_turns": min(int(cfg.agent.max_turns), int(rehearsal.max_turns)),
        "logger.wandb.enable": False,
        "molt.rollout.batch_size": prompts,
        "molt.train.batch_size": trajectories,
        "molt.rollout.micro_batch_size": micro_batch,
        "molt.train.micro_batch_size": micro_batch,
        "molt.rollout.vllm_generate_batch_size": _scaled_in_flight(molt.rollout, prompts),
        "molt.rollout.max_new_tokens": min(int(molt.rollout.max_new_tokens), int(rehearsal.max_new_tokens)),
        "molt.rollout.num_runners": 1,
        "molt.data.max_samples": total_steps * prompts,
        "molt.train.num_episodes": 1,
        "molt.train.check_weight_update_equal": True,
        "molt.eval.n_samples_per_prompt": 1,
        "molt.ckpt.save_steps": int(rehearsal.steps),
        "molt.fsdp.attn_implementation": "sdpa",
        "molt.fsdp.packing_samples": False,
    }
    return overrides


def _latest_rehearsal_dir(run_dir: Path) -> Path | None:
    candidates = [d for d in run_dir.parent.iterdir() if d != run_dir and (d / WORK_SUBDIR / STEP_FILE).is_file()]
    return max(candidates, key=lambda d: d.stat().st_mtime, default=None)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(cfg: DictConfig, run_dir: Path, resumed_from: int, log: str, phases: dict[str, float]) -> Summary:
    """The rehearsal's summary from its TensorBoard scalars (steps after `resumed_from`) and the
    part of Molt's output (`log`) this rehearsal wrote."""
    from molt_flashreinforce.rehearsal import gpu
    from molt_flashreinforce.rehearsal.standins import STANDINS
    from molt_flashreinforce.report.events import read_scalars

    scalars = read_scalars(run_dir / "tensorboard")

    def since_resume(tag: str) -> list[float]:
        return [value for step, value in scalars.get(tag, ()) if step > resumed_from]

    consumed, lag_max, kl = since_resume(metrics.ROLLOUTS_CONSUMED), since_resume(metrics.POLICY_LAG_MAX), since_resume(metrics.VLLM_KL)
    return Summary(
        experiment=str(cfg.experiment_name),
        algo=str(cfg.algo.name),
        steps=len(consumed),
        rollouts_consumed=consumed[-1] if consumed else None,
        policy_lag_mean=_mean(since_resume(metrics.POLICY_LAG_MEAN)),
        policy_lag_max=max(lag_max) if lag_max else None,
        versions_mixed_fraction=_mean(since_resume(metrics.POLICY_VERSIONS_MIXED)),
        acceptance_rate=_mean(since_resume(metrics.ACCEPTANCE_RATE)),
        reward_mean=_mean(since_resume(metrics.REWARD_MEAN)),
        vllm_kl_first_step=kl[0] if kl else None,
        weight_checks=[match.group(1).strip() for match in _WEIGHT_CHECK.finditer(log)],
        resumed_from_step=resumed_from,
        standins={} if cfg.rehearsal.mode == "gpu" else dict(STANDINS),
        real=list(REAL_PARTS) + (gpu.REAL_PARTS if cfg.rehearsal.mode == "gpu" else []),
        phases_s=phases,
    )


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    import importlib.util

    from molt_flashreinforce.rehearsal.standins import ENVIRONMENT

    env = {
        "GLOO_SOCKET_IFNAME": "lo",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "RAY_DEDUP_LOGS": "0",
        # Ray otherwise starts idle workers up front, each importing torch and Molt on 2 cores.
        "RAY_prestart_worker_first_driver": "0",
        "OMP_NUM_THREADS": "2",
        **ENVIRONMENT,
        **extra,
    }
    if importlib.util.find_spec("vllm") is None:  # never shadow a real vLLM
        standin = str(resources.files("molt_flashreinforce.rehearsal") / "vllm_standin")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [standin, os.environ.get("PYTHONPATH")]))
    return env


def _prepare_standin_launch(rehearsed: DictConfig, job) -> str:
    """rehearsal=cpu: the stand-ins' environment (logical GPUs, the vLLM stand-in); the driver module."""
    gpus = int(rehearsed.placement.actor.gpus_per_node) + int(rehearsed.placement.vllm.engines)
    job.command.env.update(_child_env({LOGICAL_GPUS_VARIABLE: str(gpus)}))
    return DRIVER_MODULE


def run_rehearsal(cfg: DictConfig, run_dir: Path) -> Summary | None:
    """Rehearse the job (None under dry_run=true, which stops after validation)."""
    from molt_flashreinforce.launch.job import LOG_NAME, latest_checkpoint, prepare_molt_job, run_molt_job
    from molt_flashreinforce.rehearsal import gpu
    from molt_flashreinforce.rehearsal.data import prepare_rehearsal_data
    from molt_flashreinforce.rehearsal.tiny_model import build_tiny_model

    on_gpus = cfg.rehearsal.mode == "gpu"
    if on_gpus and not cfg.dry_run:
        gpu.check_node(cfg)  # before any work: no CUDA, too few GPUs or no vLLM is one line
    if cfg.rehearsal.resume:
        previous = _latest_rehearsal_dir(run_dir)
        if previous is None:
            raise LaunchError(f"rehearsal.resume=true: no earlier rehearsal with a checkpoint under {run_dir.parent}; run one first.")
        if all(p.name == ".hydra" or p.suffix == ".log" for p in run_dir.iterdir()):  # only Hydra's own files
            shutil.rmtree(run_dir, ignore_errors=True)
        run_dir = previous
    work = run_dir / WORK_SUBDIR
    work.mkdir(parents=True, exist_ok=True)
    steps_file = work / STEP_FILE
    done = json.loads(steps_file.read_text())["steps"] if steps_file.is_file() and latest_checkpoint(run_dir) else 0
    total = done + int(cfg.rehearsal.steps)
    phases: dict[str, float] = {}

    started = time.monotonic()
    model_dir = work / "model"
    if not (model_dir / "config.json").is_file():
        build_tiny_model(str(cfg.model.name_or_path), model_dir, seed=int(cfg.seed))
    data_dir, data_env = prepare_rehearsal_data(str(cfg.experiment_name), work, total * prompts_per_step(cfg))
    phases["model and data"] = time.monotonic() - started

    started = time.monotonic()
    rehearsed = cfg.copy()  # with the tiny model's own context: the same checks as the real model's
    OmegaConf.set_struct(rehearsed, False)
    overrides = rehearsal_overrides(cfg, model_dir, data_dir, total)
    for key, value in (gpu.node_overrides(cfg, overrides) if on_gpus else overrides).items():
        _set(rehearsed, key, value)
    copy = model_context.extended_copy_path(rehearsed)
    if copy is not None and not copy.is_dir():  # the step a GPU user runs once (docs/launch.md)
        model_context.write_extended_copy(str(model_dir), int(rehearsed.model.max_position_embeddings), copy)
    os.environ.update(data_env)  # e.g. ALFWORLD_DATA: checked and forwarded to every worker like a user's export
    job = prepare_molt_job(rehearsed, run_dir)
    phases["validation"] = time.monotonic() - started
    for warning in job.warnings:
        print(f"WARNING: {warning}")

    if cfg.dry_run:
        print("dry_run=true: the rehearsal's model, data and Molt command are ready; not starting Ray.")
        return None
    module = gpu.prepare_launch(job) if on_gpus else _prepare_standin_launch(rehearsed, job)
    print(f"rehearsal: Molt command in {run_dir / 'launch' / 'molt_command.sh'}; log {run_dir / 'molt.log'}", flush=True)
    log_path = run_dir / LOG_NAME
    log_start = log_path.stat().st_size if log_path.is_file() else 0  # a resumed run appends to it
    started = time.monotonic()
    run_molt_job(job, module=module)
    phases["Molt (Ray start-up, actors, training, checkpoint)"] = time.monotonic() - started
    steps_file.write_text(json.dumps({"steps": total}))

    with log_path.open("rb") as log:
        log.seek(log_start)
        this_run = log.read().decode("utf-8", errors="replace")
    summary = summarize(rehearsed, run_dir, done, this_run, phases)
    (work / SUMMARY_NAME).write_text(json.dumps(asdict(summary), indent=1))
    return summary
