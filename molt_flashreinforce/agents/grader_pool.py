"""Grader processes with bounded memory and a deadline per request, queueing included.

Contract: ``GraderPool(processes, memory_bytes).submit(answer, ground_truth, deadline, compute_s)``
returns a ``concurrent.futures.Future`` that resolves to a ``Verdict``. It never raises for
the answer's sake: an answer whose comparison overruns resolves to ``TIMED_OUT`` (its grader is
killed and replaced), one whose grader dies (memory limit, crash) to ``DIED`` (replaced too).

* **Processes.** Up to ``processes`` graders, started on demand (a pool grows only under load),
  each forked from a ``multiprocessing`` forkserver that has math-verify imported already, so
  a replacement is ready in milliseconds rather than the second or more of a fresh import.
  Each grader first limits its own address space to ``memory_bytes`` (``RLIMIT_AS``, no core
  dumps) and makes itself the OOM killer's first choice (``oom_score_adj`` 1000), as the tool
  sandbox does: a host short of memory loses a grader before the process that trains.
* **Deadlines.** ``deadline`` is a ``time.monotonic()`` instant that covers the wait for a
  grader as well as the comparison; a request still waiting then resolves ``TIMED_OUT``
  without running. A comparison runs for at most ``compute_s`` (and never past the deadline),
  so a grader busy with an overrunning answer is free again after ``compute_s``.
* **Order.** Waiting requests are served shortest answer first: a flood of long or slow
  answers cannot make a short one wait behind all of them (each of them waits at most until
  its own deadline instead).

Callers bound their own wait on the future by the deadline (``grading.grade``); a future
they give up on is cancelled and never runs.
"""

from __future__ import annotations

import concurrent.futures
import enum
import heapq
import itertools
import multiprocessing
import os
import resource
import threading
import time
from dataclasses import dataclass, field

_SERVE_MODULE = "molt_flashreinforce.agents.strict_equivalence"


class Verdict(enum.Enum):
    CORRECT = "correct"
    WRONG = "wrong"
    TIMED_OUT = "timed_out"
    DIED = "died"


def _serve(connection, memory_bytes: int) -> None:
    """Grader process: limit itself, then answer ``(answer, ground_truth)`` pairs until EOF."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    from molt_flashreinforce.agents.strict_equivalence import equivalent

    while True:
        try:
            answer, ground_truth = connection.recv()
        except EOFError:
            return
        try:
            verdict = equivalent(answer, ground_truth)
        except Exception:  # noqa: BLE001 - an answer that breaks the parser is simply not equivalent
            verdict = False
        connection.send(verdict)


@dataclass(order=True)
class _Request:
    cost: int
    order: int
    answer: str = field(compare=False)
    ground_truth: str = field(compare=False)
    deadline: float = field(compare=False)
    compute_s: float = field(compare=False)
    future: concurrent.futures.Future = field(compare=False, default_factory=concurrent.futures.Future)


class _Grader:
    """One grader process and this side of its pipe."""

    def __init__(self, context, memory_bytes: int):
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, memory_bytes), daemon=True, name="math-grader")
        self.process.start()
        child.close()

    def ask(self, answer: str, ground_truth: str, wait_s: float) -> Verdict:
        try:
            self.connection.send((answer, ground_truth))
            if not self.connection.poll(max(0.0, wait_s)):
                return Verdict.TIMED_OUT
            return Verdict.CORRECT if self.connection.recv() else Verdict.WRONG
        except (EOFError, OSError):
            return Verdict.DIED

    def close(self) -> None:
        self.process.kill()
        self.process.join()
        self.connection.close()


class GraderPool:
    def __init__(self, processes: int, memory_bytes: int):
        self.processes = processes
        self.memory_bytes = memory_bytes
        self._context = multiprocessing.get_context("forkserver")
        self._pending: list[_Request] = []
        self._order = itertools.count()
        self._lock = threading.Condition()
        self._workers = 0
        self._idle_workers = 0
        self._graders: set[_Grader] = set()

    def submit(self, answer: str, ground_truth: str, deadline: float, compute_s: float) -> concurrent.futures.Future:
        request = _Request(len(answer), next(self._order), answer, ground_truth, deadline, compute_s)
        with self._lock:
            heapq.heappush(self._pending, request)
            if self._idle_workers == 0 and self._workers < self.processes:
                self._workers += 1
                threading.Thread(target=self._work, name="math-grader-slot", daemon=True).start()
            self._lock.notify()
        return request.future

    def warm_up(self) -> None:
        """Start the forkserver (which imports math-verify) and one grader now, in the background,
        so that the first answers do not spend their time bound on it."""
        threading.Thread(target=self._warm_up, name="math-grader-warm-up", daemon=True).start()

    def _warm_up(self) -> None:
        self.submit("1", "1", time.monotonic() + 600.0, 600.0)

    def grader_pids(self) -> list[int]:
        """Process ids of the live graders (for inspection; they change as graders are replaced)."""
        with self._lock:
            return [g.process.pid for g in self._graders if g.process.is_alive()]

    def close(self) -> None:
        with self._lock:
            graders, self._graders = list(self._graders), set()
        for grader in graders:
            grader.close()

    def _next_request(self) -> _Request:
        with self._lock:
            self._idle_workers += 1
            while not self._pending:
                self._lock.wait()
            self._idle_workers -= 1
            return heapq.heappop(self._pending)

    def _start_grader(self) -> _Grader:
        # Only takes effect before the forkserver's first start; set here, not at import, so that
        # importing this package leaves a program's own forkserver alone.
        self._context.set_forkserver_preload([_SERVE_MODULE])
        grader = _Grader(self._context, self.memory_bytes)
        with self._lock:
            self._graders.add(grader)
        return grader

    def _retire(self, grader: _Grader) -> None:
        with self._lock:
            self._graders.discard(grader)
        grader.close()

    def _work(self) -> None:
        """One slot: a grader process and the requests it serves, one at a time."""
        grader = None
        while True:
            request = self._next_request()
            if not request.future.set_running_or_notify_cancel():
                continue  # its caller gave up waiting
            now = time.monotonic()
            if now >= request.deadline:
                request.future.set_result(Verdict.TIMED_OUT)
                continue
            if grader is not None and not grader.process.is_alive():
                self._retire(grader)  # died between answers: none of them is to blame
                grader = None
            if grader is None:
                grader = self._start_grader()
            wait_s = min(request.deadline, now + request.compute_s) - now
            verdict = grader.ask(request.answer, request.ground_truth, wait_s)
            if verdict in (Verdict.TIMED_OUT, Verdict.DIED):
                self._retire(grader)
                grader = None
            request.future.set_result(verdict)


def node_cpus() -> int:
    """CPUs this process may run on (its affinity), the default pool size."""
    return len(os.sched_getaffinity(0))
