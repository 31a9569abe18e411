"""Grader processes with bounded memory and a deadline per request, queueing included.

Contract: ``GraderPool(processes, memory_bytes, rules).submit(answer, ground_truth, deadline, compute_s)``
returns a ``concurrent.futures.Future`` that resolves to a ``Verdict``. ``rules`` names the comparison
its graders run (``RULES``: this package's strict equivalence, or Molt's example grader's rules). It never raises for
the answer's sake: an answer whose comparison overruns resolves to ``TIMED_OUT``, one whose
grader dies (memory limit, crash) to ``DIED`` (the grader is replaced).

* **Processes.** Up to ``processes`` graders, started on demand (a pool grows only under load),
  each forked from a ``multiprocessing`` forkserver that has math-verify imported already.
  Each grader first limits its own address space to ``memory_bytes`` (``RLIMIT_AS``, no core
  dumps) and makes itself the OOM killer's first choice (``oom_score_adj`` 1000), as the tool
  sandbox does: a host short of memory loses a grader before the process that trains. It then
  compares ``_WARM_UP``'s answers (under a second) before it takes requests.
* **Deadlines.** ``deadline`` is a ``time.monotonic()`` instant that covers the wait for a
  grader as well as the comparison; a request still waiting then resolves ``TIMED_OUT``
  without running. A request's runs take ``compute_s`` in all at most, and its verdict is in by
  the deadline: a run ends ``GRACE_S`` before it.
* **Stopping.** A grader ends a run itself (``SIGALRM`` raises in the comparison, as
  math-verify's own timeouts do), answers "out of time" and stays up for the next request.
  Killing it instead would make the next answers pay: a fresh grader spends a tenth of a second
  or more on the first answer of each shape while math-verify's LaTeX parser fills its tables,
  a warm one milliseconds. A grader that has not answered ``GRACE_S`` after a run's end (stuck
  in C code) is killed and replaced.
* **Order: lanes of growing slices.** A new request's first run lasts ``SLICE_S`` at most; an
  honest answer finishes within it. One that does not goes back to the queue for the next
  lane's slice, ``SLICE_GROWTH`` times longer, and so on until ``compute_s`` is spent; each run
  starts anew (a stopped comparison leaves nothing to resume). A grader takes a request from
  the lowest lane waiting, by turns the shortest answer (a flood of long answers cannot delay a
  short one) and the one with the earliest deadline (nor can a stream of short ones, arriving
  after it, delay a long one). So an honest answer waits for about two first slices per slow
  answer queued before it (fewer if it is the shorter), shared among the graders, plus at most
  the run each grader has in progress (later lanes run only while lane 0 is empty); not for
  the slow answers' whole budgets.

Callers bound their own wait on the future by the deadline (``grading.grade``); a future
they give up on before its first run is cancelled and never runs (later runs end by the
deadline anyway).
"""

from __future__ import annotations

import concurrent.futures
import enum
import importlib
import itertools
import multiprocessing
import os
import resource
import signal
import threading
import time
from dataclasses import dataclass, field

# rules -> the module whose ``equivalent(answer, ground_truth)`` the graders run, and what else it
# imports on a process's first comparison (half a second for sympy and antlr): the forkserver
# imports them once, so that no grader does it, let alone is stopped in the middle of it.
RULES = {
    "strict": ("molt_flashreinforce.agents.strict_equivalence", ["sympy.tensor.tensor", "antlr4.LL1Analyzer"]),
    "molt": ("molt_flashreinforce.agents.molt_math_rules", ["sympy.parsing.sympy_parser", "pylatexenc.latex2text"]),
}
# A new grader compares these before it takes requests: the first fraction, root, set, interval
# or polynomial a process meets costs it 0.1-0.4 s while the parser builds its tables, the next
# ones a millisecond or two. Paid once per grader (they are rarely replaced), not in a slice.
_WARM_UP = [
    ("\\frac{3}{4}", "0.75"), ("3\\sqrt{2}", "\\sqrt{18}"), ("y=7", "7"), ("2^{5}", "32"), ("\\{3,4\\}", "\\{4,3\\}"),
    ("(0,2]", "(0, 2]"), ("\\frac{\\pi}{3}", "\\pi/3"), ("x^2-1", "(x-1)(x+1)"), ("(1,2)", "(2,1)"),
]  # fmt: skip
# A warm grader compares an honest answer in milliseconds, and in about 0.1 s a construct the
# warm-up missed; this leaves room for that several times over, as a busy machine needs (the
# slice is wall-clock time). Each slow answer costs those queued behind it this much, divided
# among the graders.
SLICE_S = 0.5
# Lane n's slice is SLICE_S * SLICE_GROWTH**n: an answer that needs time t is stopped about
# log4(t / SLICE_S) times, which costs it at most 4/3 t of its compute_s before the run that
# finishes; a larger factor wastes more of the budget, a smaller one stops slow answers more often.
SLICE_GROWTH = 4
# How long after a run's end a grader's "out of time" may take to arrive before it is killed. A
# signal handler runs between bytecodes, so it usually arrives within milliseconds, but a busy
# machine may not schedule the grader for a while (0.18 s seen on a loaded 2-core machine), and
# a replacement costs a second or more of warm-up: be generous.
GRACE_S = 0.5
# A new grader is ready in a second or two (a fork, multiprocessing importing the program's
# main module in it, _WARM_UP); one that is not ready after this never will be.
START_S = 30.0


class Verdict(enum.Enum):
    CORRECT = "correct"
    WRONG = "wrong"
    TIMED_OUT = "timed_out"
    DIED = "died"


class _OutOfTime(BaseException):
    """Raised in a grader when its run ends (not an ``Exception``, which math-verify and sympy
    catch and would read as "not equivalent")."""


class _Run:
    """A grader's timer for one comparison (``SIGALRM``): it stops that comparison, nothing else."""

    def __init__(self):
        self.comparing = self.ended = False
        signal.signal(signal.SIGALRM, self._end)

    def _end(self, signum, frame) -> None:
        if self.comparing:
            self.ended = True
            raise _OutOfTime

    def compare(self, equivalent, answer: str, ground_truth: str, run_s: float) -> bool | None:
        """``equivalent(answer, ground_truth)``, or None when it did not finish within ``run_s``."""
        verdict, self.ended = None, False
        try:
            self.comparing = True
            signal.setitimer(signal.ITIMER_REAL, run_s)
            try:
                verdict = equivalent(answer, ground_truth)
            except Exception:  # noqa: BLE001 - an answer that breaks the parser is simply not equivalent
                verdict = False
            self.comparing = False
        except _OutOfTime:  # raised anywhere up to ``comparing = False``: the run ended first
            self.comparing = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        # ``ended`` also catches an _OutOfTime that some library code swallowed.
        return None if self.ended else bool(verdict)


def _serve(connection, memory_bytes: int, rules: str) -> None:
    """Grader process: limit itself, warm up, say it is ready, then answer ``(answer,
    ground_truth, run_s)`` until EOF with True, False or None (out of time)."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    equivalent = importlib.import_module(RULES[rules][0]).equivalent

    for answer, ground_truth in _WARM_UP:
        equivalent(answer, ground_truth)
    run = _Run()
    connection.send("ready")
    while True:
        try:
            answer, ground_truth, run_s = connection.recv()
        except EOFError:
            return
        connection.send(run.compare(equivalent, answer, ground_truth, run_s))


@dataclass
class _Request:
    answer: str
    ground_truth: str
    deadline: float
    compute_s: float  # what is left of its budget for runs
    order: int
    lane: int = 0  # how many runs it has had
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)

    def run_s(self, now: float) -> float:
        return min(SLICE_S * SLICE_GROWTH**self.lane, self.compute_s, self.deadline - GRACE_S - now)


# The two orders a grader takes waiting requests in, turn about (lowest lane first in both).
_TURNS = (
    lambda request: (request.lane, len(request.answer), request.order),  # shortest first
    lambda request: (request.lane, request.deadline, request.order),  # earliest deadline first
)


class _Grader:
    """One grader process and this side of its pipe."""

    def __init__(self, context, memory_bytes: int, rules: str):
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, memory_bytes, rules), daemon=True, name="math-grader")
        self.process.start()
        child.close()
        # Its start-up is no answer's slice: wait for it here. One that never gets ready is
        # killed, and ask() answers DIED.
        try:
            if not self.connection.poll(START_S):
                raise EOFError
            self.connection.recv()
        except (EOFError, OSError):
            self.process.kill()

    def ask(self, answer: str, ground_truth: str, run_s: float) -> Verdict | None:
        """CORRECT or WRONG; TIMED_OUT when the grader stopped the comparison after ``run_s``;
        DIED when the grader died; None when it did not stop (it is still busy)."""
        try:
            self.connection.send((answer, ground_truth, run_s))
            if not self.connection.poll(run_s + GRACE_S):
                return None
            verdict = self.connection.recv()
        except (EOFError, OSError):
            return Verdict.DIED
        return Verdict.TIMED_OUT if verdict is None else Verdict.CORRECT if verdict else Verdict.WRONG

    def close(self) -> None:
        self.process.kill()
        self.process.join()
        self.connection.close()


class GraderPool:
    def __init__(self, processes: int, memory_bytes: int, rules: str = "strict"):
        if rules not in RULES:
            raise ValueError(f"grader rules {rules!r}: choose one of {', '.join(RULES)}")
        self.processes = processes
        self.memory_bytes = memory_bytes
        self.rules = rules
        self._context = multiprocessing.get_context("forkserver")
        self._pending: list[_Request] = []
        self._order = itertools.count()
        self._turns = itertools.cycle(_TURNS)
        self._lock = threading.Condition()
        self._workers = 0
        self._idle_workers = 0
        self._graders: set[_Grader] = set()

    def submit(self, answer: str, ground_truth: str, deadline: float, compute_s: float) -> concurrent.futures.Future:
        request = _Request(answer, ground_truth, deadline, compute_s, next(self._order))
        with self._lock:
            self._queue(request)
            # More requests waiting than idle slots to take them (a slot still waking counts as idle).
            if len(self._pending) > self._idle_workers and self._workers < self.processes:
                self._workers += 1
                threading.Thread(target=self._work, name="math-grader-slot", daemon=True).start()
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

    def _queue(self, request: _Request) -> None:
        with self._lock:
            self._pending.append(request)
            self._lock.notify()

    def _next_request(self) -> _Request:
        with self._lock:
            self._idle_workers += 1
            while not self._pending:
                self._lock.wait()
            self._idle_workers -= 1
            request = min(self._pending, key=next(self._turns))  # a few hundred at most: a scan is cheap
            self._pending.remove(request)
            return request

    def _start_grader(self) -> _Grader:
        # Only takes effect before the forkserver's first start; set here, not at import, so that
        # importing this package leaves a program's own forkserver alone.
        module, lazy_imports = RULES[self.rules]
        self._context.set_forkserver_preload([module, *lazy_imports])
        grader = _Grader(self._context, self.memory_bytes, self.rules)
        with self._lock:
            self._graders.add(grader)
        return grader

    def _replace(self, grader: _Grader) -> _Grader:
        with self._lock:
            self._graders.discard(grader)
        grader.close()
        return self._start_grader()

    def _work(self) -> None:
        """One slot: a grader process and the requests it serves, one run at a time. The grader
        starts before the slot takes a request, so that no request is held while it starts."""
        grader = self._start_grader()
        while True:
            request = self._next_request()
            if request.lane == 0 and not request.future.set_running_or_notify_cancel():
                continue  # its caller gave up waiting
            if not grader.process.is_alive():
                grader = self._replace(grader)  # died between answers: none of them is to blame
            started = time.monotonic()
            run_s = request.run_s(started)
            if run_s <= 0:
                request.future.set_result(Verdict.TIMED_OUT)
                continue
            verdict = grader.ask(request.answer, request.ground_truth, run_s)
            request.compute_s -= time.monotonic() - started
            if verdict is Verdict.TIMED_OUT and request.compute_s > 0:  # its slice ran out: the next lane
                request.lane += 1
                self._queue(request)
            else:
                request.future.set_result(verdict or Verdict.TIMED_OUT)
            if verdict in (None, Verdict.DIED):  # gone, or stuck past its run: not asked again
                grader = self._replace(grader)


def node_cpus() -> int:
    """CPUs this process may run on (its affinity), the default pool size."""
    return len(os.sched_getaffinity(0))
