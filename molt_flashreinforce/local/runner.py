"""`run(cfg, run_dir) -> summary`: one local (CPU) training run, resumable in place.

Layout of `run_dir`:
    tensorboard/          event files, Molt's tag names (molt_flashreinforce.metrics); each
                          update also logs its own duration under Molt's step-time tag
    checkpoints/          step_<version>.pt; rerunning in the same run_dir resumes from the latest
    summary.json          the returned summary

A fresh run measures the random-init policy, runs the supervised warm start (reported apart from
RL; loaded instead when `local.warm_start.cache_dir` already holds it), evaluates at step 0, then
performs `local.steps` updates with a progress bar, evaluating every `local.eval.every` updates
and at the end, and prints a one-line summary. SIGUSR2 (SLURM's `--signal` warning before the
time limit) saves a checkpoint after the update under way and training goes on; a job that the
limit ends then resumes from that update when rerun in the same run_dir.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from molt_flashreinforce import metrics as tags
from molt_flashreinforce.local import warm_start_cache
from molt_flashreinforce.local.checkpoint import check_resumable, latest_checkpoint, load_checkpoint, save_checkpoint
from molt_flashreinforce.local.config import LocalConfig
from molt_flashreinforce.local.trainer import LocalTrainer

# Settings that may differ when a run is resumed: they change how far and how visibly it runs,
# not what it computes.
_RESUME_MAY_CHANGE = ("steps", "eval", "checkpoint", "progress_bar")


def _fingerprint(cfg: LocalConfig, algo: Any, seed: int) -> dict[str, Any]:
    from omegaconf import OmegaConf

    local = {k: v for k, v in vars(cfg).items() if k not in _RESUME_MAY_CHANGE}
    local["warm_start"] = dataclasses.replace(cfg.warm_start, cache_dir=None)  # where it is kept, not what it is
    algo_plain = OmegaConf.to_container(algo, resolve=True) if OmegaConf.is_config(algo) else dict(algo)
    return {"local": repr(local), "algo": repr(sorted(algo_plain.items())), "seed": seed}


class _TimeLimitNotice:
    """Notes SIGUSR2 while training (only the main thread may handle signals; elsewhere it keeps its default)."""

    def __init__(self) -> None:
        self.pending = False
        self._previous = None

    def __enter__(self) -> "_TimeLimitNotice":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGUSR2, self._note)
        return self

    def _note(self, signum, frame) -> None:
        self.pending = True

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGUSR2, self._previous)


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def run(cfg: Any, run_dir: str | Path) -> dict[str, Any]:
    started = time.perf_counter()
    local = LocalConfig.from_node(cfg.get("local") if hasattr(cfg, "get") else cfg.local)
    algo, seed = cfg.algo, int(cfg.seed)
    run_dir = Path(run_dir)
    torch.set_num_threads(local.num_threads)
    trainer = LocalTrainer(local, algo, seed)
    source = local.task.datasource
    fingerprint = _fingerprint(local, algo, seed)

    latest = latest_checkpoint(run_dir / "checkpoints")
    if latest is not None:
        saved = load_checkpoint(latest)
        check_resumable(saved["fingerprint"], fingerprint, latest)
        trainer.load_state_dict(saved["trainer"])
        record = saved["record"]
        print(f"Resuming {run_dir} from {latest.name} (update {trainer.version} of {local.steps}).")
    else:
        record = _warm_start(trainer, local, seed)
    writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=trainer.version + 1 if latest else None)
    if latest is None:
        for counter in (tags.ROLLOUTS_CONSUMED, tags.GENERATED_TOKENS, tags.TRAINED_TOKENS):
            writer.add_scalar(counter, 0.0, 0)
        writer.add_scalar(tags.eval_pass1(source), record["eval_history"][0][1], 0)

    checkpoint_path = latest
    rl_started = time.perf_counter()
    bar = tqdm(total=local.steps, initial=min(trainer.version, local.steps), unit="update",
               desc=f"{algo.name} lag={local.policy_lag}", disable=not local.progress_bar, dynamic_ncols=True)
    with _TimeLimitNotice() as time_limit:
        while trainer.version < local.steps:
            step_started = time.perf_counter()
            logged = trainer.step()
            # Sampling and the update only: evals and checkpoints are not training time.
            logged[tags.STEP_TIME] = time.perf_counter() - step_started
            version = trainer.version
            for tag, value in logged.items():
                writer.add_scalar(tag, value, version)
            if version % local.eval.every == 0 or version == local.steps:
                accuracy = trainer.evaluate()[tags.eval_pass1(source)]
                writer.add_scalar(tags.eval_pass1(source), accuracy, version)
                record["eval_history"].append((version, accuracy))
            postfix = {"reward": f"{logged[tags.REWARD_MEAN]:.3f}", "eval_acc": f"{record['eval_history'][-1][1]:.3f}"}
            if tags.ACCEPTANCE_RATE in logged:
                postfix["accept"] = f"{logged[tags.ACCEPTANCE_RATE]:.2f}"
            bar.set_postfix(postfix, refresh=False)
            bar.update(1)
            if version % local.checkpoint.every == 0 or version == local.steps or time_limit.pending:
                writer.flush()
                record["rl_wall_s"] += time.perf_counter() - rl_started
                rl_started = time.perf_counter()
                state = {"trainer": trainer.state_dict(), "record": record, "fingerprint": fingerprint}
                checkpoint_path = save_checkpoint(run_dir / "checkpoints", version, state, local.checkpoint.keep_last)
                if time_limit.pending:
                    time_limit.pending = False
                    bar.write(f"time limit near (SIGUSR2): checkpoint at update {version}; rerun in {run_dir} to resume")
    bar.close()
    writer.close()

    history = record["eval_history"]
    summary = {
        "experiment": cfg.get("experiment_name") or "tiny",
        "algo": algo.name,
        "policy_lag": local.policy_lag,
        "seed": seed,
        "loss_path": type(trainer.objective).__name__,
        "updates": trainer.version,
        "rollouts_consumed": trainer.rollouts_consumed,
        "generated_tokens": trainer.generated_tokens,
        "trained_tokens": trainer.trained_tokens,
        "eval_pass1_random_init": record["eval_pass1_random_init"],
        "eval_pass1_start": history[0][1],
        "eval_pass1_end": history[-1][1],
        "eval_history": history,
        "warm_start_steps": record.get("warm_start_steps", local.warm_start.steps),  # runs from before the target
        "warm_start_loss": record["warm_start_loss"],
        "warm_start_wall_s": record["warm_start_wall_s"],
        "rl_wall_s": record["rl_wall_s"],
        "wall_s": time.perf_counter() - started,
        "peak_rss_mib": _peak_rss_mib(),
        "checkpoint": str(checkpoint_path) if checkpoint_path else None,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"{source}: {algo.name} lag={local.policy_lag} seed={seed} | eval pass@1 {summary['eval_pass1_start']:.3f}"
        f" -> {summary['eval_pass1_end']:.3f} after {summary['updates']} updates"
        f" ({summary['rollouts_consumed']} rollouts; {summary['eval_pass1_random_init']:.3f} at random init,"
        f" warm start {summary['warm_start_steps']} steps) | {summary['wall_s']:.0f} s"
        f" | peak RSS {summary['peak_rss_mib']:.0f} MiB | checkpoint {summary['checkpoint']}"
    )
    return summary


def _warm_start(trainer: LocalTrainer, local: LocalConfig, seed: int) -> dict[str, Any]:
    cache = warm_start_cache.cache_file(local, seed)
    cached = warm_start_cache.load(cache)
    if cached is not None:
        trainer.load_warm_start(cached["state"])
        record = cached["record"]
        print(f"Warm start: loaded from {cache} ({record['warm_start_steps']} supervised steps that took "
              f"{record['warm_start_wall_s']:.1f} s); eval pass@1 {record['eval_pass1_random_init']:.3f} -> "
              f"{record['eval_history'][0][1]:.3f}. RL starts from here.")
        return record
    random_init = trainer.evaluate()[tags.eval_pass1(local.task.datasource)]
    started = time.perf_counter()
    loss, taken = trainer.warm_start() if local.warm_start.steps else (float("nan"), 0)
    wall = time.perf_counter() - started
    start = trainer.evaluate()[tags.eval_pass1(local.task.datasource)]
    if local.warm_start.steps:
        reached = "" if local.warm_start.target_pass1 is None else \
            f" (to training pass@1 >= {local.warm_start.target_pass1:g}, at most {local.warm_start.steps})"
        print(f"Warm start: {taken} supervised steps{reached} in {wall:.1f} s (final loss {loss:.3f}); "
              f"eval pass@1 {random_init:.3f} -> {start:.3f}. RL starts from here.")
    record = {
        "eval_pass1_random_init": random_init,
        "warm_start_steps": taken,
        "warm_start_loss": loss,
        "warm_start_wall_s": wall,
        "rl_wall_s": 0.0,
        "eval_history": [(0, start)],
    }
    if cache is not None:
        warm_start_cache.store(cache, trainer.warm_start_state(), record)
    return record
