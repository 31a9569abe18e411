"""A run that outlives its faults: restarts after a crash or a stall, a checkpoint and a requeue
when SLURM asks the run to stop.

    run(allocation, settings, resources, resilience, run_dir, start, checkpoint_step) -> History

`run` is the one way a launch and a rehearsal run Molt: on this machine (allocation None), or as
the head of a multi-node allocation (`ray_nodes.lead`), with `Supervisor` around the attempts.

`start(env)` launches one attempt of Molt's driver (env: where the workers report progress,
cluster/progress.py) and returns its process. While it runs, the supervisor watches:

* **Crash.** The driver exits non-zero: an actor or node died (its one line comes from
  `actor_watch`, which ends the driver within seconds), or Molt raised. A worker that refused to
  run (a Molt not as tested) records why in the progress files: the attempt stops at once, and the
  run too, since every attempt would fail the same way.
* **Stall.** No optimizer step and no finished rollout for `stall_timeout_s` (before the
  attempt's first report, `startup_timeout_s`, which covers model loading and the engines'
  start). The Python stacks of every process of the run go to `<run_dir>/stacks/attempt-<n>/`
  (`stacks`; `dump_elsewhere` asks the other nodes for theirs), then it is handled as a crash.
* **A signal.** SIGUSR2 (SLURM's `--signal` warning before the time limit) or SIGTERM
  (preemption; `scancel --signal=TERM`): the workers are asked for a checkpoint at the next step
  boundary (cluster/progress.py), and the attempt is stopped once it is written, or after
  `checkpoint_wait_s`. A checkpoint is announced only when `checkpoint_step()` (what Molt's own
  loader would resume from) is the step saved; otherwise the line names the last complete one,
  which the next attempt resumes from. Under SLURM the run then asks to be requeued (`Requeue`; at most `max_requeues` times),
  and the requeued job resumes in the same run directory. That is for a job SLURM still shows
  RUNNING (a preemption's grace time, `scancel --signal=TERM`). A SIGTERM of a job that is
  already ending (a plain `scancel`, the time limit itself: slurmctld shows it COMPLETING, and
  SIGKILL follows after KillWait) stops the run at once, with no checkpoint and no requeue; a
  requeue then would bring a cancelled job back.

After a crash or a stall the attempt's processes are stopped (`before_restart` does the rest, e.g.
wait for a lost node to rejoin) and a new attempt resumes from the last complete checkpoint, up to
`max_restarts` times; one line says what happened and from which step it goes on. Not restarted:
an attempt that failed through the run's own code or config (an actor's constructor raised, Molt
raised on its own) before its first optimizer step, since every attempt would fail the same way; a
rendezvous port another process took first is not such a fault (cluster/port_race.py). Every attempt
is recorded in `<run_dir>/launch/attempts.json` (start, end, outcome, cause, the step it resumed
from, the last step it reported, and its launch: the SLURM job, which a requeue keeps), and a
launch's `History` (restarts, requeues, where each attempt resumed) is read from there, so it
covers the attempts of the job's earlier, requeued runs too.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Protocol

from molt_flashreinforce.cluster import processes, ray_nodes, slurm, stacks
from molt_flashreinforce.cluster.errors import ClusterError
from molt_flashreinforce.cluster.slurm import Allocation
from molt_flashreinforce.cluster.progress import (DONE_FILE, FAILURE_FILE, PROGRESS_DIR_VARIABLE, REQUEST_FILE,
                                                  ROLLOUT_FILE, STEP_FILE, failure_line, read_json, write_json)

ATTEMPTS_FILE = "attempts.json"  # under <run_dir>/launch/
PROGRESS_SUBDIR = "progress"
STACKS_SUBDIR = "stacks"
POLL_S = 1.0
PREFIX = "molt-flashreinforce"
FINISHED, FAULT, STALLED, STOPPED, ENDED = "finished", "fault", "stalled", "stopped", "ended"
RUNNING = "RUNNING"  # slurmctld's JobState of a job that is not ending


@dataclass(frozen=True)
class Resilience:
    """`resilience.*` of the config."""

    max_restarts: int = 2
    stall_timeout_s: float = 1800.0
    startup_timeout_s: float = 3600.0
    checkpoint_wait_s: float = 600.0
    max_requeues: int = 20

    @classmethod
    def from_node(cls, node) -> "Resilience":
        return cls(max_restarts=int(node.max_restarts), stall_timeout_s=float(node.stall_timeout_s),
                   startup_timeout_s=float(node.startup_timeout_s), checkpoint_wait_s=float(node.checkpoint_wait_s),
                   max_requeues=int(node.max_requeues))


class Child(Protocol):
    pid: int

    def poll(self) -> int | None: ...

    def wait(self) -> int: ...


class Requeue(Exception):
    """The run stopped because SLURM asked (a checkpoint was written, or the wait for one ran out):
    the caller tears the node down, then `requeue_and_wait()`."""


@dataclass
class Attempt:
    attempt: int
    started: str
    resumed_from_step: int
    slurm_job: str | None
    launch: str  # the launch it belongs to: its SLURM job (kept by a requeue), else one supervisor
    ended: str | None = None
    outcome: str | None = None  # FINISHED, FAULT, STALLED, STOPPED or ENDED
    cause: str | None = None
    last_step: int | None = None


@dataclass(frozen=True)
class History:
    """A launch's attempts, requeued SLURM runs of its job included."""

    attempts: int
    restarts: int  # attempts that followed a crash or a stall
    requeues: int  # attempts that followed SLURM's request to stop
    resumed_from: tuple[int, ...]  # the step each attempt resumed from, in order

    @property
    def resumed_from_step(self) -> int:
        return self.resumed_from[0] if self.resumed_from else 0


def history(run_dir: Path, launch: str) -> History:
    attempts = [a for a in read_attempts(run_dir) if a.get("launch") == launch]
    followed = [previous.get("outcome") for previous in attempts[:-1]]
    return History(attempts=len(attempts), restarts=sum(o in (FAULT, STALLED) for o in followed),
                   requeues=followed.count(STOPPED), resumed_from=tuple(a["resumed_from_step"] for a in attempts))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def read_attempts(run_dir: Path) -> list[dict]:
    path = run_dir / "launch" / ATTEMPTS_FILE
    return json.loads(path.read_text()) if path.is_file() else []


class Supervisor:
    def __init__(self, run_dir: Path, resilience: Resilience, checkpoint_step: Callable[[], int],
                 job: str | None = None) -> None:
        self.run_dir = run_dir
        self.resilience = resilience
        self.checkpoint_step = checkpoint_step
        self.job = job
        self.launch = f"slurm-{job}" if job else uuid.uuid4().hex
        self.progress = run_dir / PROGRESS_SUBDIR
        self._signal: int | None = None

    # -- records ---------------------------------------------------------------------------
    def _record(self, attempt: Attempt) -> None:
        path = self.run_dir / "launch" / ATTEMPTS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        attempts = [a for a in read_attempts(self.run_dir) if a["attempt"] != attempt.attempt]
        write_json(path, [*attempts, asdict(attempt)])  # type: ignore[arg-type]

    def _reported_step(self) -> int | None:
        record = read_json(self.progress / STEP_FILE)
        return int(record["step"]) if record else None

    def _last_report(self, since: float) -> float | None:
        times = [path.stat().st_mtime for path in (self.progress / STEP_FILE, self.progress / ROLLOUT_FILE)
                 if path.exists()]
        times = [t for t in times if t >= since]
        return max(times) if times else None

    # -- one attempt -----------------------------------------------------------------------
    def _fresh_progress(self) -> None:
        self.progress.mkdir(parents=True, exist_ok=True)
        for name in (STEP_FILE, ROLLOUT_FILE, REQUEST_FILE, DONE_FILE, FAILURE_FILE):
            (self.progress / name).unlink(missing_ok=True)

    def _stall(self, started: float) -> str | None:
        last = self._last_report(started)
        limit = self.resilience.stall_timeout_s if last is not None else self.resilience.startup_timeout_s
        if time.time() - (last if last is not None else started) <= limit:
            return None
        what = "no optimizer step and no finished rollout" if last is not None else "no rollout or step since the start"
        key = "stall_timeout_s" if last is not None else "startup_timeout_s"
        return f"stalled: {what} for {limit:g} s (resilience.{key})"

    def _checkpoint_then_stop(self, child: Child, why: str) -> str:
        request = uuid.uuid4().hex
        write_json(self.progress / REQUEST_FILE, {"id": request, "why": why})
        print(f"{PREFIX}: {why}: checkpointing at the next step boundary (at most "
              f"{self.resilience.checkpoint_wait_s:g} s, resilience.checkpoint_wait_s)", flush=True)
        deadline = time.monotonic() + self.resilience.checkpoint_wait_s
        saved = None
        while saved is None and time.monotonic() < deadline and child.poll() is None:
            done = read_json(self.progress / DONE_FILE)
            saved = done["step"] if done and done.get("id") == request else None
            time.sleep(POLL_S)
        processes.stop_tree(child.pid)
        complete = self.checkpoint_step()
        if saved is not None and complete == saved:  # on disk, and what Molt's loader resumes from
            return f"{why}: checkpoint at step {saved}"
        stands = f"the last complete one stands ({f'step {complete}' if complete else 'none: a new attempt starts at step 0'})"
        if saved is not None:
            return f"{why}: Molt saved step {saved} but no complete checkpoint of it is on disk; {stands}"
        return f"{why}: no checkpoint within {self.resilience.checkpoint_wait_s:g} s, {stands}"

    def _watch(self, child: Child, started: float, dump_elsewhere: Callable[[Path], None],
               attempt: int) -> tuple[str, str]:
        """(outcome, cause): outcome is FINISHED, FAULT, STALLED, STOPPED (on SLURM's request) or
        ENDED (SLURM is ending the job)."""
        while True:
            code = child.poll()
            if code is not None:
                if code == 0:
                    return FINISHED, "finished"
                failure = read_json(self.progress / FAILURE_FILE)
                return FAULT, failure_line(failure) if failure else f"{PREFIX}: Molt exited with status {code}"
            failure = read_json(self.progress / FAILURE_FILE)
            if failure is not None and failure.get("code_fault"):  # a worker refused to run: no need to wait
                processes.stop_tree(child.pid)
                return FAULT, failure_line(failure)
            if self._signal is not None:
                name = signal.Signals(self._signal).name
                state = slurm.job_state(self.job) if self.job else None
                if state not in (None, RUNNING):
                    processes.stop_tree(child.pid)
                    return ENDED, f"{PREFIX}: SLURM job {self.job} is ending ({state}, {name}): stopped at once"
                why = "time limit near (SIGUSR2)" if self._signal == signal.SIGUSR2 else f"asked to stop ({name})"
                return STOPPED, f"{PREFIX}: {self._checkpoint_then_stop(child, why)}"
            stall = self._stall(started)
            if stall is not None:
                where = self.run_dir / STACKS_SUBDIR / f"attempt-{attempt}"
                stacks.dump_descendants(where / "head")
                dump_elsewhere(where)
                processes.stop_tree(child.pid)
                return STALLED, f"{PREFIX}: {stall}; the stacks of every process are in {where}"
            time.sleep(POLL_S)

    # -- the run ---------------------------------------------------------------------------
    def run(self, start: Callable[[dict[str, str]], Child], before_restart: Callable[[], None] = lambda: None,
            dump_elsewhere: Callable[[Path], None] = lambda where: None) -> int:
        previous = signal.signal(signal.SIGTERM, self._note), signal.signal(signal.SIGUSR2, self._note)
        try:
            return self._attempts(start, before_restart, dump_elsewhere)
        finally:
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGUSR2, previous[1])

    def _note(self, signum, frame) -> None:
        self._signal = signum

    def _attempts(self, start, before_restart, dump_elsewhere) -> int:
        restarts = 0
        number = len(read_attempts(self.run_dir))
        while True:
            self._fresh_progress()
            attempt = Attempt(attempt=number, started=_now(), resumed_from_step=self.checkpoint_step(), slurm_job=self.job,
                              launch=self.launch)
            self._record(attempt)
            started = time.time()
            child = start({PROGRESS_DIR_VARIABLE: str(self.progress)})
            outcome, cause = self._watch(child, started, dump_elsewhere, number)
            child.wait()
            attempt.ended, attempt.outcome, attempt.cause, attempt.last_step = _now(), outcome, cause, self._reported_step()
            self._record(attempt)
            if outcome == FINISHED:
                return history(self.run_dir, self.launch).restarts
            failure = read_json(self.progress / FAILURE_FILE)
            if failure is None:  # else the driver printed the line itself
                print(cause, flush=True)
            if outcome == ENDED:
                raise processes.Terminated()
            if outcome == STOPPED:
                raise Requeue(cause)
            code_fault = failure.get("code_fault", False) if failure else outcome == FAULT  # Molt raised itself
            if failure and failure.get("every_attempt"):  # e.g. a worker's Molt is not the tested one
                raise ClusterError(f"{cause.removeprefix(PREFIX + ': ')}; not restarted: every attempt would fail "
                                   f"the same way. {self.run_dir} keeps the logs")
            if code_fault and attempt.last_step is None:
                raise ClusterError(
                    f"{cause.removeprefix(PREFIX + ': ')}; not restarted: it failed before its first optimizer step, "
                    f"so every attempt would. {self.run_dir} keeps the logs: {self.run_dir / 'molt.log'} says why")
            if restarts >= self.resilience.max_restarts:
                raise ClusterError(
                    f"{cause.removeprefix(PREFIX + ': ')}; not restarted: resilience.max_restarts={self.resilience.max_restarts} "
                    f"used up. {self.run_dir} keeps the logs and checkpoints: run the same command again to resume")
            restarts += 1
            number += 1
            before_restart()
            print(f"{PREFIX}: restart {restarts} of {self.resilience.max_restarts}: resuming from the checkpoint at "
                  f"step {self.checkpoint_step()}", flush=True)


def requeue_and_wait(resilience: Resilience, cause: str) -> None:
    """Under SLURM: requeue this job, then wait for SLURM to end this run of it (returning first
    would let the job complete before the requeue lands, and submitit record a result)."""
    cause = cause.removeprefix(PREFIX + ": ")
    job = slurm.job_id(os.environ)
    if job is None:
        raise ClusterError(f"{cause}; stopped (not under SLURM, so not requeued): run the same command again to resume")
    requeues = slurm.restart_count(os.environ)
    if requeues >= resilience.max_requeues:
        raise ClusterError(f"{cause}; not requeued: job {job} was requeued {requeues} times already "
                           f"(resilience.max_requeues={resilience.max_requeues})")
    print(f"{PREFIX}: requeueing SLURM job {job} (requeue {requeues + 1} of at most {resilience.max_requeues}); "
          "it resumes in this run directory", flush=True)
    for shielded in processes.SHIELDED_SIGNALS:
        signal.signal(shielded, signal.SIG_IGN)  # the requeue's own SIGTERM must not interrupt the wait
    slurm.requeue(job)
    while True:
        time.sleep(60)


def run(allocation: Allocation | None, settings: ray_nodes.ClusterSettings, resources: ray_nodes.NodeResources,
        resilience: Resilience, run_dir: Path, start: Callable[[dict[str, str]], Child],
        checkpoint_step: Callable[[], int]) -> History:
    """Molt's attempts under a `Supervisor`; the launch's `History` (its requeued runs included). Without an allocation Molt
    starts its own Ray and every process an attempt leaves is stopped before the next; on a
    multi-node allocation this is the head's part, and a restart first waits for every node
    (one whose Ray node died starts a new one, `ray_nodes.join`)."""
    supervisor = Supervisor(run_dir, resilience, checkpoint_step, job=slurm.job_id(os.environ))
    try:
        if allocation is None:
            processes.become_subreaper()
            try:
                supervisor.run(start, before_restart=processes.stop_descendants)
            finally:
                processes.stop_descendants()
            return history(run_dir, supervisor.launch)

        def attempts(cluster_env: dict[str, str]) -> None:
            supervisor.run(
                lambda env: start({**cluster_env, **env}),
                before_restart=lambda: ray_nodes.wait_for_nodes(allocation, settings, run_dir),
                dump_elsewhere=lambda where: ray_nodes.request_stacks(allocation, run_dir, where))

        ray_nodes.lead(allocation, settings, resources, run_dir, attempts)
        return history(run_dir, supervisor.launch)
    except Requeue as stopped:
        requeue_and_wait(resilience, str(stopped))
        raise  # not reached: SLURM ends this task
