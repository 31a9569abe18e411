"""Each node's task owns every process the run starts on its node, and leaves none behind.

`become_subreaper()` makes this process the Linux child subreaper of its descendants, so a
process whose parent dies (a Ray worker's grader pool, a sandbox, a daemonised helper) is
re-parented here instead of to init, where neither SLURM's process tracking nor we could find
it. `stop_descendants()` then ends them all: SIGTERM, a grace period, SIGKILL, and reaping.
`terminate_on_sigterm()` turns SLURM's SIGTERM (scancel, preemption, the time limit) into an
exception, so the task's `finally` blocks (logs, teardown) run before KillWait's SIGKILL.

SLURM delivers a job's signals (scancel, preemption's SIGTERM, the `--signal` warning) to every
process of the job step at once, and Ray's processes exit on SIGTERM (its core worker's handler)
and on SIGUSR2 (the default action). `shielded` is the `preexec_fn` for what a task starts (the
Ray nodes, Molt's driver): it blocks both signals in the child's signal mask, which the processes
below it inherit (Ray's workers, which the raylet starts with a fresh mask, ignore both through
our setup hook: plugin/progress.py), so that only the task decides what a signal means
(cluster.supervisor: a checkpoint at the next step boundary, then a requeue). The task's own
teardown therefore stops them with SIGINT and, after a grace period, SIGKILL.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

import psutil

_PR_SET_CHILD_SUBREAPER = 36
SHIELDED_SIGNALS = frozenset({signal.SIGTERM, signal.SIGUSR2})


class Terminated(SystemExit):
    """SIGTERM arrived: unwinds like SystemExit with 128 + SIGTERM, running every `finally`."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def become_subreaper() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def terminate_on_sigterm() -> None:
    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: teardown must not be interrupted again
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)


def defer_signals() -> None:
    """SIGTERM and SIGUSR2 leave this process running (a worker node's task: it stops when the head
    does, and SLURM's KillWait SIGKILL still ends it)."""
    def note(signum, frame):
        print(f"{signal.Signals(signum).name} received: this node stops when the head does", flush=True)

    for deferred in SHIELDED_SIGNALS:
        signal.signal(deferred, note)


def shielded() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, SHIELDED_SIGNALS)


def _ask_to_stop(process: psutil.Process) -> None:
    for polite in (signal.SIGTERM, signal.SIGINT):  # SIGINT for the shielded ones
        try:
            process.send_signal(polite)
        except psutil.NoSuchProcess:
            return


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop_tree(pid: int, grace_s: float = 10.0) -> None:
    """End a process and everything below it (SIGINT/SIGTERM, then SIGKILL after `grace_s`)."""
    try:
        processes = _tree(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return
    _stop_all(processes, grace_s)


def _stop_all(processes: list[psutil.Process], grace_s: float) -> list[str]:
    for process in processes:
        _ask_to_stop(process)
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    killed = []
    for process in alive:
        try:
            killed.append(process.name())
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    return killed


def stop_descendants(grace_s: float = 10.0) -> list[str]:
    """End every descendant of this process; the names of those that needed SIGKILL."""
    me = psutil.Process()
    killed = _stop_all(me.children(recursive=True), grace_s)
    killed += _stop_all(me.children(recursive=True), 1.0)  # orphans re-parented to us while the others stopped
    _reap()
    return killed


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return

