"""`rehearsal=cpu`: an experiment's exact Molt job, run for a few steps through Molt's real
async runtime on this machine's CPU.

    run_rehearsal(cfg, run_dir) -> Summary

The rehearsal composes the experiment's own config, changes only what a CPU needs
(`rehearsal_overrides`: a tiny model with the paper model's shape card, small data the project
generates in the experiment's own format, one policy actor and one engine on logical Ray GPUs,
sdpa attention without packing, small batches and short generations, `rehearsal.steps`
optimizer steps, a checkpoint at the end), then goes through the same `prepare_molt_job` path
as a GPU launch (checks, rendering, Molt's parser and validation, run records) and runs Molt's
`train(args)` in a child process (`rehearsal.driver`) with the stand-ins of `standins.standins`.
The experiment's agent file, reward and async queue structure are kept; in-flight rollouts
scale with the batch, so the queue's lag structure survives the shrink.

On a multi-node SLURM allocation (`run_rehearsal(cfg, run_dir, allocation)`) the rehearsal goes
through the same cluster code as a GPU launch (`cluster.ray_nodes`): the first node leads, the
others join its Ray cluster, and `layout` spreads the placement over the nodes as the GPU
launch would, with one logical GPU per node: the actor's ranks on `placement.actor.nodes`
nodes (expert parallelism across them for an MoE), an engine on each of the others.

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
from molt_flashreinforce.cluster import ray_nodes
from molt_flashreinforce.cluster.slurm import Allocation
from molt_flashreinforce.rehearsal.standins import LOOPBACK
from molt_flashreinforce.launch import model_context
from molt_flashreinforce.launch.errors import LaunchError

DRIVER_MODULE = "molt_flashreinforce.rehearsal.driver"
WORK_SUBDIR = "rehearsal"
SUMMARY_NAME = "summary.json"
STEP_FILE = "steps_done.json"
LOGICAL_GPUS_VARIABLE = "MOLT_FLASHREINFORCE_REHEARSAL_GPUS"
RAY_CPUS = 8  # logical, per Ray node: one per actor Molt starts, all sharing this machine's cores
# Each node of a multi-node rehearsal: logical CPUs and one logical GPU, servers on the loopback.
# Its nodes share one host, so only the head runs a log monitor (each would stream every log of
# the host to the driver, and Molt's output would arrive once per node).
REHEARSAL_NODE = ray_nodes.NodeResources(
    num_cpus=RAY_CPUS, num_gpus=1, extra_args=(f"--node-ip-address={LOOPBACK}",),
    head_args=("--include-dashboard=false",), worker_args=("--include-log-monitor=false",))
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
    engine: str = "vllm"  # the rollout engine: vllm (vLLM's CPU build, or vLLM on the GPUs) or standin
    ray_nodes: int | None = None  # Ray nodes that hosted the run's actors
    actors_by_node: dict[str, dict[str, int]] = field(default_factory=dict)
    phases_s: dict[str, float] = field(default_factory=dict)
    # Every attempt of the launch, its requeued SLURM runs included (cluster.supervisor.History):
    restarts: int = 0  # attempts that followed a crash or a stall
    requeues: int = 0  # attempts that followed SLURM's request to stop
    attempts_resumed_from: list[int] = field(default_factory=list)  # the step each attempt resumed from
    # The engine-vs-trainer mismatch at the first step, whose batch the engine sampled with the weights
    # the trainer scores it with (no policy lag yet): the mean over sequences of the sampled-token
    # Bernoulli KL, the trust region's bound (flashreinforce) and the share of trajectories admitted.
    sequence_kl_first_step: float | None = None
    delta: float | None = None
    acceptance_first_step: float | None = None

    def lines(self) -> list[str]:
        def fmt(value, digits=3):
            return "n/a" if value is None else f"{value:.{digits}g}" if isinstance(value, float) else str(value)

        landed = sum("landed on every vLLM weight" in line for line in self.weight_checks)
        out = [
            f"rehearsal {self.experiment} algo={self.algo}: {self.steps} optimizer steps"
            + (f" (resumed at step {self.resumed_from_step})" if self.resumed_from_step else "")
            + (f"; {self.restarts} restart(s), {self.requeues} requeue(s), attempts resumed from steps "
               f"{', '.join(map(str, self.attempts_resumed_from))} (launch/attempts.json)"
               if self.restarts or self.requeues else ""),
            f"  rollouts consumed {fmt(self.rollouts_consumed)}; policy lag mean {fmt(self.policy_lag_mean)} "
            f"max {fmt(self.policy_lag_max)}; trajectories spanning a refit {fmt(self.versions_mixed_fraction)}",
            f"  acceptance rate {fmt(self.acceptance_rate)}; reward mean {fmt(self.reward_mean)}; "
            f"weight check landed {landed}/{len(self.weight_checks)}",
            f"  engine vs trainer at the first step: vllm_kl {fmt(self.vllm_kl_first_step)}; sequence Bernoulli KL "
            f"{fmt(self.sequence_kl_first_step)} against delta {fmt(self.delta)}; admitted {fmt(self.acceptance_first_step)}",
            f"  ran on {fmt(self.ray_nodes)} Ray node(s): " + "; ".join(
                f"{node}: " + ", ".join(f"{name} x{count}" for name, count in actors.items())
                for node, actors in self.actors_by_node.items()),
            f"  rollout engine: {ENGINE_NAMES[self.engine]}",
            "  ran for real: " + ", ".join(self.real),
            "  stand-ins: " + ("; ".join(f"{name} ({what})" for name, what in self.standins.items()) or "none"),
            "  wall time: " + ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in self.phases_s.items()),
        ]
        return out


ENGINE_NAMES = {"vllm": "vLLM (Molt's RolloutRayActor)", "standin": "the HF stand-in (rehearsal.engine.CpuRolloutEngine)"}
REAL_PARTS = [
    "Molt's driver train(args) and its validation",
    "RLTrainer, GenerateSamplesActor, TrainingActor (async queue, partial rollout, refit)",
    "AgentRunnerActor + StepEnvRunner over HTTP through the Rust vllm-router",
    "PolicyModelActor with FSDP2 (nemo_automodel) and Molt's checkpointing",
    "the experiment's agent file and reward",
    "this plugin's estimator, loss and runtime patches (lag probe and bound, carry-over, progress)",
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


@dataclass(frozen=True)
class Layout:
    """Where the rehearsal's actor ranks and engines go: all on one node, or spread like the
    placement with one logical GPU per node."""

    nodes: int
    actor_nodes: int
    actor_gpus_per_node: int
    expert_parallel: int
    engines: int

    @property
    def gpus_per_node(self) -> int:
        return self.actor_gpus_per_node + self.engines if self.nodes == 1 else 1


def layout(cfg: DictConfig, nodes: int) -> Layout:
    """The placement scaled to `nodes` rehearsal nodes; refused in one line when it cannot be."""
    placement = cfg.placement
    # Molt builds MoE models only with expert parallelism, so an EP experiment keeps EP 2 (two
    # FSDP ranks over gloo); every other one gets a single policy actor.
    moe = int(placement.actor.ep) > 1
    if nodes == 1:
        expert_parallel = 2 if moe else 1
        return Layout(nodes=1, actor_nodes=1, actor_gpus_per_node=expert_parallel, expert_parallel=expert_parallel, engines=1)
    actor_nodes, placement_nodes = int(placement.actor.nodes), int(placement.nodes)
    if not actor_nodes < nodes <= placement_nodes:
        raise LaunchError(
            f"rehearsal=cpu on {nodes} nodes: placement.nodes={placement_nodes} with the actor on placement.actor.nodes="
            f"{actor_nodes} and the engines on the others, so rehearse on {actor_nodes + 1}"
            f"{f' to {placement_nodes}' if placement_nodes > actor_nodes + 1 else ''} nodes, or on one")
    return Layout(nodes=nodes, actor_nodes=actor_nodes, actor_gpus_per_node=1,
                  expert_parallel=actor_nodes if moe else 1, engines=nodes - actor_nodes)


def rehearsal_overrides(cfg: DictConfig, model_dir: Path, data_dir: Path, total_steps: int,
                        spread: Layout) -> dict[str, object]:
    """Every key the rehearsal changes, with its new value."""
    rehearsal = cfg.rehearsal
    prompts = prompts_per_step(cfg)
    trajectories = prompts * int(cfg.algo.group_size)
    molt = cfg.molt
    actor_ranks = spread.actor_nodes * spread.actor_gpus_per_node
    micro_batch = max(1, trajectories // (2 * actor_ranks))  # two micro-batches: accumulation runs
    overrides: dict[str, object] = {
        "model.name_or_path": str(model_dir),
        "model.dir": str(model_dir.parent / "models"),
        "data.dir": str(data_dir),
        "placement.nodes": spread.nodes,
        "placement.gpus_per_node": spread.gpus_per_node,
        "placement.actor.nodes": spread.actor_nodes,
        "placement.actor.gpus_per_node": spread.actor_gpus_per_node,
        "placement.actor.tp": 1,
        "placement.actor.ep": spread.expert_parallel,
        "placement.actor.cp": 1,
        "placement.vllm.engines": spread.engines,
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
        "molt.eval.eval_at_start": bool(rehearsal.eval_at_start),
        "molt.ckpt.save_steps": int(rehearsal.save_steps or rehearsal.steps),
        "exports.steps": [int(step) for step in rehearsal.export_steps],
        "exports.every": None,
        "resilience.stall_timeout_s": float(rehearsal.stall_timeout_s),
        "resilience.startup_timeout_s": float(rehearsal.startup_timeout_s),
        "resilience.checkpoint_wait_s": float(rehearsal.checkpoint_wait_s),
        "molt.fsdp.attn_implementation": "sdpa",
        "molt.fsdp.packing_samples": False,
    }
    return overrides


def _latest_rehearsal_dir(run_dir: Path) -> Path | None:
    candidates = [d for d in run_dir.parent.iterdir() if d != run_dir and (d / WORK_SUBDIR / STEP_FILE).is_file()]
    return max(candidates, key=lambda d: d.stat().st_mtime, default=None)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(cfg: DictConfig, run_dir: Path, history, log: str, phases: dict[str, float]) -> Summary:
    """The rehearsal's summary from its TensorBoard scalars (the steps after its launch's first
    attempt resumed), the part of Molt's output (`log`) this rehearsal wrote, and the launch's
    attempts (`cluster.supervisor.History`)."""
    from molt_flashreinforce.cluster import actor_map
    from molt_flashreinforce.launch.job import ACTOR_MAP_NAME
    from molt_flashreinforce.rehearsal import gpu
    from molt_flashreinforce.rehearsal.standins import VLLM_REAL_PARTS, standins
    from molt_flashreinforce.report.events import read_scalars

    scalars = read_scalars(run_dir / "tensorboard")
    resumed_from = history.resumed_from_step

    def since_resume(tag: str) -> list[float]:
        return [value for step, value in scalars.get(tag, ()) if step > resumed_from]

    placed = actor_map.read(run_dir / "launch" / ACTOR_MAP_NAME)
    consumed, lag_max, kl = since_resume(metrics.ROLLOUTS_CONSUMED), since_resume(metrics.POLICY_LAG_MAX), since_resume(metrics.VLLM_KL)
    sequence_kl, accepted = since_resume(metrics.SEQUENCE_KL_MEAN), since_resume(metrics.ACCEPTANCE_RATE)
    delta = cfg.algo.get("delta")
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
        standins={} if cfg.rehearsal.mode == "gpu" else standins(bool(cfg.rehearsal.float32), str(cfg.rehearsal.engine)),
        real=list(REAL_PARTS) + (gpu.REAL_PARTS if cfg.rehearsal.mode == "gpu" else
                                 VLLM_REAL_PARTS if cfg.rehearsal.engine == "vllm" else []),
        engine="vllm" if cfg.rehearsal.mode == "gpu" else str(cfg.rehearsal.engine),
        ray_nodes=len(placed) if placed else None,
        actors_by_node=placed or {},
        phases_s=phases,
        restarts=history.restarts,
        requeues=history.requeues,
        sequence_kl_first_step=sequence_kl[0] if sequence_kl else None,
        delta=float(delta) if delta is not None else None,
        acceptance_first_step=accepted[0] if accepted else None,
        attempts_resumed_from=list(history.resumed_from),
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


def _prepare_standin_launch(job, spread: Layout, float32: bool, engine: str, work: Path) -> str:
    """rehearsal=cpu: the stand-ins' environment (logical GPUs, the rollout engine, float32, vLLM's
    caches in the run unless a compile cache is given); the driver module."""
    from molt_flashreinforce.rehearsal.standins import ENGINE_VARIABLE, FLOAT32_VARIABLE

    job.command.env.update(_child_env({
        LOGICAL_GPUS_VARIABLE: str(spread.gpus_per_node), FLOAT32_VARIABLE: "1" if float32 else "0",
        ENGINE_VARIABLE: engine, "VLLM_CACHE_ROOT": str(work / "vllm_cache"),
        "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(work / "inductor_cache")}))
    return DRIVER_MODULE


def check_engine(cfg: DictConfig, say_why: bool = True) -> str:
    """rehearsal.engine of a CPU rehearsal, refused in one line when it cannot run; with `say_why`,
    one line saying why when it is the stand-in."""
    from molt_flashreinforce.evaluation.engine import vllm_version
    from molt_flashreinforce.rehearsal.standins import ENGINES

    engine = str(cfg.rehearsal.get("engine", "vllm"))
    if engine not in ENGINES:
        raise LaunchError(f"rehearsal.engine={engine}: use rehearsal.engine=vllm (Molt's engine actor on vLLM's CPU "
                          "build) or rehearsal.engine=standin (the package's HF stand-in)")
    if engine == "vllm" and not cfg.dry_run and vllm_version() is None:
        raise LaunchError("rehearsal.engine=vllm needs vLLM's CPU build, which is not installed: run "
                          "`bash scripts/setup_vllm.sh`, or rehearse with the stand-in engine (rehearsal.engine=standin)")
    if engine == "standin" and say_why:
        reason = cfg.rehearsal.get("standin_reason") or "chosen in the rehearsal's config or on the command line"
        print(f"rehearsal.engine=standin: the rollout engine is the package's HF stand-in, not vLLM: {reason}", flush=True)
    return engine


def run_rehearsal(cfg: DictConfig, run_dir: Path, allocation: Allocation | None = None) -> Summary | None:
    """Rehearse the job (None under dry_run=true, which stops after validation, and on the nodes of a
    multi-node allocation that join the first node's cluster)."""
    from molt_flashreinforce.rehearsal import gpu

    on_gpus = cfg.rehearsal.mode == "gpu"
    if on_gpus and allocation is not None:
        raise LaunchError(f"rehearsal=gpu runs on the GPUs of one node, but this allocation has {len(allocation.nodes)}; "
                          "submit it with --nodes=1 (hydra.launcher.nodes=1), or rehearse the nodes with rehearsal=cpu")
    if on_gpus and not cfg.dry_run:
        gpu.check_node(cfg)  # before any work: no CUDA, too few GPUs or no vLLM is one line
    if not on_gpus:  # before any work too; the stand-in's reason is said once, by the head
        check_engine(cfg, say_why=allocation is None or allocation.is_head)
    if cfg.rehearsal.resume:
        previous = _latest_rehearsal_dir(run_dir)
        if previous is None:
            raise LaunchError(f"rehearsal.resume=true: no earlier rehearsal with a checkpoint under {run_dir.parent}; run one first.")
        if all(p.name == ".hydra" or p.suffix == ".log" for p in run_dir.iterdir()):  # only Hydra's own files
            shutil.rmtree(run_dir, ignore_errors=True)
        run_dir = previous
    spread = layout(cfg, len(allocation.nodes) if allocation is not None else 1)
    settings = ray_nodes.ClusterSettings.from_node(cfg.cluster)
    if allocation is not None and not allocation.is_head:
        ray_nodes.join(allocation, settings, REHEARSAL_NODE, run_dir)
        return None
    with ray_nodes.heading(allocation, run_dir):
        return _rehearse(cfg, run_dir, allocation, spread)


def _rehearse(cfg: DictConfig, run_dir: Path, allocation: Allocation | None, spread: Layout) -> Summary | None:
    """The head's part: model, data, validation, then Molt through the cluster code."""
    from molt_flashreinforce.launch.job import LOG_NAME, latest_checkpoint, prepare_molt_job, run_supervised
    from molt_flashreinforce.rehearsal import gpu
    from molt_flashreinforce.rehearsal.data import prepare_rehearsal_data
    from molt_flashreinforce.rehearsal.tiny_model import build_tiny_model

    on_gpus = cfg.rehearsal.mode == "gpu"
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
    overrides = rehearsal_overrides(cfg, model_dir, data_dir, total, spread)
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
    module = gpu.prepare_launch(job) if on_gpus else _prepare_standin_launch(
        job, spread, bool(cfg.rehearsal.float32), str(cfg.rehearsal.engine), work)
    print(f"rehearsal: Molt command in {run_dir / 'launch' / 'molt_command.sh'}; log {run_dir / 'molt.log'}", flush=True)
    log_path = run_dir / LOG_NAME
    log_start = log_path.stat().st_size if log_path.is_file() else 0  # a resumed run appends to it
    started = time.monotonic()
    history = run_supervised(job, rehearsed, allocation, REHEARSAL_NODE, module=module)
    phases["Molt (Ray start-up, actors, training, checkpoint)"] = time.monotonic() - started
    steps_file.write_text(json.dumps({"steps": total}))

    with log_path.open("rb") as log:
        log.seek(log_start)
        this_run = log.read().decode("utf-8", errors="replace")
    summary = summarize(rehearsed, run_dir, history, this_run, phases)
    (work / SUMMARY_NAME).write_text(json.dumps(asdict(summary), indent=1))
    return summary
