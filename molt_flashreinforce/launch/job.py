"""One Molt job: prepare (render, check, validate, record) and run it in a child process.

`prepare_molt_job(cfg, run_dir)` does everything except starting Ray: checks the config,
renders the flags, lists missing resources, parses and validates the flags with Molt's own
parser and checks, builds the PolicyLoss the GPU actors will build, and writes the run records.
`start_molt_job(job)` then starts `molt_main` in a child process, so Ray and CUDA state never
outlive an attempt, with its output copied to `<run_dir>/molt.log` and where its actors ran in
`<run_dir>/launch/actors_by_node.json`; `run_molt_job(job)` waits for it and raises (keeping the
log) when it fails. `run_supervised(job, cfg, allocation, resources)` is how a launch runs it: on
the node(s) of the allocation (`cluster.ray_nodes`), one attempt after another under
`cluster.supervisor` (restarts, stall watchdog, checkpoint and requeue on SLURM's signals).
`launch(cfg, run_dir, allocation)` is all of it for one `backend=molt` job of the command line.

An attempt in a run directory that holds a complete Molt checkpoint gets `--ckpt.load_enable`
(a rerun, a restart, a requeued job), and every attempt continues the run's one W&B run.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from molt_flashreinforce.launch import checks
from molt_flashreinforce.launch.errors import LaunchError
from molt_flashreinforce.launch.model_context import extended_copy_path
from molt_flashreinforce.launch.records import wandb_resume_env, write_records
from molt_flashreinforce.launch.render import CHECKPOINT_SUBDIR, MOLT_ENTRY_MODULE, MoltCommand, render_command

LOG_NAME = "molt.log"
LOAD_FLAG = "--ckpt.load_enable"
ACTOR_MAP_NAME = "actors_by_node.json"  # under <run_dir>/launch/, written by molt_main
# Stands in for secrets read from the environment at launch (W&B key) when a dry run validates.
_DRY_RUN_SECRET = "dry-run-placeholder"


@dataclass
class MoltJob:
    run_dir: Path
    command: MoltCommand
    warnings: list[str]
    molt_messages: str  # what Molt's validation printed (its own warnings)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint Molt's own loader would resume from, if any (plugin/seams.py)."""
    from molt_flashreinforce.plugin.seams import resumable_checkpoint

    return resumable_checkpoint(run_dir / CHECKPOINT_SUBDIR / "state" / "_actor")


def prepare_molt_job(cfg: DictConfig, run_dir: Path, checked: bool = False) -> MoltJob:
    """Everything but Ray for one job; `checked`: the caller ran `checks.check_config(cfg)` already
    (the command line's validation), so it is not run twice."""
    from molt_flashreinforce.launch.molt_cli import MoltArgumentError, build_parser, flag_dests, parse_and_validate
    from molt_flashreinforce.plugin import policy_loss_from_args
    from molt_flashreinforce.plugin import seams

    if not checked:
        checks.check_config(cfg)
    try:
        seams.check()
    except seams.UnsupportedMolt as error:
        raise LaunchError(str(error)) from None
    agent_file, agent_problem = checks.resolve_agent_file(cfg)
    parser = build_parser()
    model_copy = extended_copy_path(cfg)
    command = render_command(
        cfg, run_dir, flag_dests(parser), agent_file, resume=latest_checkpoint(run_dir) is not None,
        model_copy=model_copy)
    problems = checks.missing_resources(cfg, agent_problem, model_copy)
    if problems and not cfg.dry_run:
        raise LaunchError("a real launch needs:\n  - " + "\n  - ".join(problems) + "\n(dry_run=true lists these as warnings.)")

    messages = io.StringIO()
    try:
        with contextlib.redirect_stdout(messages):
            args = parse_and_validate(command.argv(missing=_DRY_RUN_SECRET if cfg.dry_run else None), parser)
            policy_loss_from_args(args)
    except MoltArgumentError as error:
        raise LaunchError(f"Molt's parser refused the rendered flags: {error}") from error
    except (ValueError, AssertionError, NotImplementedError) as error:
        raise LaunchError(f"Molt rejected the configuration: {error}") from error
    except RuntimeError as error:
        # Molt's validation imports some GPU-only packages itself (nemo_automodel for routing
        # replay): absent on this machine, that is something a real launch needs, not a bad config.
        if not (cfg.dry_run and isinstance(error.__cause__, ImportError)):
            raise LaunchError(f"Molt rejected the configuration: {error}") from error
        problems.append(f"Molt's validation needs a package this machine lacks, so it stopped early: {error}")
    write_records(run_dir, cfg, command, problems)
    return MoltJob(run_dir=run_dir, command=command, warnings=problems, molt_messages=messages.getvalue())


def checkpoint_step(run_dir: Path) -> int:
    """The global step of the checkpoint Molt would resume from (0 without one)."""
    from molt_flashreinforce.plugin.seams import checkpoint_step as step_of

    return step_of(latest_checkpoint(run_dir))


class MoltProcess:
    """One attempt of Molt's driver, its output copied line by line to stdout and the run's log."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        from molt_flashreinforce.cluster.processes import shielded

        self.log_path = log_path
        self._process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                         preexec_fn=shielded)
        self.pid = self._process.pid
        self._copier = threading.Thread(target=self._copy, daemon=True)
        self._copier.start()

    def _copy(self) -> None:
        with self.log_path.open("a", encoding="utf-8") as log:
            for line in self._process.stdout:
                sys.stdout.write(line)
                log.write(line)
                log.flush()

    def poll(self) -> int | None:
        return self._process.poll()

    def wait(self) -> int:
        code = self._process.wait()
        self._copier.join()
        return code


def start_molt_job(job: MoltJob, extra_env: dict[str, str] | None = None,
                   module: str = MOLT_ENTRY_MODULE) -> MoltProcess:
    """Start `module` (Molt's entry point; the CPU rehearsal passes its driver) on the job's flags."""
    from molt_flashreinforce.launch.molt_main import ACTOR_MAP_VARIABLE

    placed = job.run_dir / "launch" / ACTOR_MAP_NAME
    placed.unlink(missing_ok=True)  # an earlier attempt's map must not pass for this one's
    argv = job.command.argv()
    if LOAD_FLAG not in argv and latest_checkpoint(job.run_dir) is not None:
        argv.append(LOAD_FLAG)  # a checkpoint written since the job was prepared: a restart resumes
    env = {**os.environ, **job.command.env, **wandb_resume_env(job.run_dir), **(extra_env or {}),
           ACTOR_MAP_VARIABLE: str(placed)}
    return MoltProcess([sys.executable, "-u", "-m", module, *argv], env, job.run_dir / LOG_NAME)


def run_molt_job(job: MoltJob, extra_env: dict[str, str] | None = None, module: str = MOLT_ENTRY_MODULE) -> None:
    """One attempt, to its end; a failure raises."""
    process = start_molt_job(job, extra_env, module)
    code = process.wait()
    if code != 0:
        raise RuntimeError(f"Molt exited with status {code}; its output is in {process.log_path}")


def run_supervised(job: MoltJob, cfg: DictConfig, allocation, resources, module: str = MOLT_ENTRY_MODULE):
    """Run the job on the allocation's nodes (None: this machine) under the supervisor; the launch's
    `supervisor.History` (restarts and requeues, the step each attempt resumed from)."""
    from molt_flashreinforce.cluster import ray_nodes, supervisor

    return supervisor.run(
        allocation, ray_nodes.ClusterSettings.from_node(cfg.cluster), resources,
        supervisor.Resilience.from_node(cfg.resilience), job.run_dir,
        start=lambda env: start_molt_job(job, extra_env=env, module=module),
        checkpoint_step=lambda: checkpoint_step(job.run_dir))


def launch(cfg: DictConfig, run_dir: Path, allocation) -> None:
    """`backend=molt`: on a multi-node allocation's other nodes, join the head's Ray cluster; on the
    head (or this machine), prepare the job, print Molt's command and, unless a dry run, run it."""
    from molt_flashreinforce.cluster import ray_nodes

    settings = ray_nodes.ClusterSettings.from_node(cfg.cluster)
    gpu_node = ray_nodes.NodeResources()  # Ray detects each node's CPUs and GPUs
    if allocation is not None and not allocation.is_head:
        ray_nodes.join(allocation, settings, gpu_node, run_dir)  # the head node's task prepares and runs the job
        return
    with ray_nodes.heading(allocation, run_dir):
        print("Checking the flags with Molt's own parser and validation (importing Molt takes about 20 s) ...", flush=True)
        job = prepare_molt_job(cfg, run_dir, checked=True)  # validated by the command line (app/dispatch.py)
        if job.molt_messages.strip():
            print(f"Molt's validation said:\n{job.molt_messages.rstrip()}")
        for warning in job.warnings:
            print(f"WARNING: a real launch needs: {warning}")
        print(f"Molt command ({run_dir / 'launch' / 'molt_command.sh'}):\n{job.command.shell()}")
        if cfg.dry_run:
            print("dry_run=true: not starting Ray.")
            return
        history = run_supervised(job, cfg, allocation, gpu_node)
        after = [f"{count} {what}(s)" for count, what in ((history.restarts, "restart"), (history.requeues, "requeue")) if count]
        print(f"Molt finished{' after ' + ' and '.join(after) if after else ''}; attempts in "
              f"{run_dir / 'launch' / 'attempts.json'}")
