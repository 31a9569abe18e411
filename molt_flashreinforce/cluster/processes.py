"""Each node's task owns every process the run starts on its node, and leaves none behind.

`become_subreaper()` makes this process the Linux child subreaper of its descendants, so a
process whose parent dies (a Ray worker's grader pool, a sandbox, a daemonised helper) is
re-parented here instead of to init, where neither SLURM's process tracking nor we could find
it. `stop_descendants()` then ends them all: SIGTERM, a grace period, SIGKILL, and reaping.
`terminate_on_sigterm()` turns SLURM's SIGTERM (scancel, preemption, the time limit) into an
exception, so the task's `finally` blocks (logs, teardown) run before KillWait's SIGKILL.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

import psutil

_PR_SET_CHILD_SUBREAPER = 36


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


def stop_descendants(grace_s: float = 10.0) -> list[str]:
    """End every descendant of this process; the names of those that needed SIGKILL."""
    me = psutil.Process()
    children = me.children(recursive=True)
    for child in children:
        try:
            child.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    # Orphans re-parented to us while the others stopped are descendants too.
    alive = [*alive, *(p for p in me.children(recursive=True) if p not in alive)]
    killed = []
    for process in alive:
        try:
            killed.append(process.name())
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
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

