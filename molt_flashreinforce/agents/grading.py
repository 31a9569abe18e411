"""0/1 grading of a model's final answer against a ground truth, bounded in time.

Contract: ``grade(response, ground_truth, timeout_s) -> Grade`` returns within ``timeout_s``
plus ``SLACK_S``, queueing included, however many grades are in flight; ``await
grade_async(...)`` is the same without blocking the event loop; ``extract_answer(response)`` is
the answer a grade compares. ``GRADER`` (``MATH_GRADER``) picks the rules, one of ``GRADERS``:

``molt``: the rules of Molt's example math grader, which graded the paper's numbers
(``molt_math_rules``: the last ``\\boxed{}``, else an "answer is" phrase, else the last number;
string normalization, then sympy), run in this module's grader processes under the same bound.

``strict`` (the default): the answer is the content of the **last** ``\\boxed{...}`` (or
``\\fbox{...}``) of ``response``; none means incorrect with ``missing_answer``. Then, in order:

1. an answer equal to the ground truth up to spacing, ``\\left``/``\\right``, ``\\text{}``
   wrappers and case is correct (no parser runs);
2. an answer that fails one of ``answer_screens``' static screens (length, nesting, exponent
   towers, factorials of factorials, matrix size) is incorrect at once, ``rejected`` naming
   the screen;
3. otherwise ``strict_equivalence.equivalent`` decides in a grader process of this module's
   ``GraderPool``: math-verify's equivalences, but only for an answer its parser read whole.
   The comparison may use half of ``timeout_s`` in all (so a grader busy with an overrunning
   answer is free again while a waiting answer still has time), in runs that start short (the
   pool's lanes: slow answers cannot keep an honest one waiting); an answer that overruns, or
   that is still waiting at ``timeout_s``, is incorrect with ``timed_out``; one whose grader
   died is incorrect with ``grader_died``. Dead graders are replaced.

Settings (environment, read once at import): ``MATH_GRADER`` (``strict`` or ``molt``, default
``strict``; the launcher sets it from ``agent.grader``), ``MATH_GRADER_TIMEOUT`` (seconds, default 5),
``MATH_GRADER_PROCESSES`` (default: the CPUs this process may use), ``MATH_GRADER_MEM_BYTES``
(address space of each grader, default 1 GiB). ``Grade.info()`` gives the numeric keys the
agents put in Molt's ``Result.info`` (Molt logs their per-step means).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import re
import time
from dataclasses import dataclass

from molt_flashreinforce.agents import molt_math_rules
from molt_flashreinforce.agents.answer_screens import screen
from molt_flashreinforce.agents.grader_pool import RULES, GraderPool, Verdict, node_cpus
from molt_flashreinforce.metrics import GRADER_REJECTED, GRADER_RESTARTS, GRADER_TIMEOUTS, MISSING_ANSWER, step_key

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")
# A grade returns at most this long after its timeout: the time to notice the deadline and
# hand the verdict over; replacing a grader that would not stop happens after the caller has
# its answer.
SLACK_S = 0.25
COMPUTE_SHARE = 0.5


def _setting(name: str, default: str, parse, fix: str):
    raw = os.environ.get(name, default)
    try:
        value = parse(raw)
    except ValueError:
        value = None
    if value is None or value <= 0:
        raise ValueError(f"{name}={raw!r} is not usable: {fix}.")
    return value


GRADERS = tuple(RULES)
GRADER = os.environ.get("MATH_GRADER", "strict")
if GRADER not in GRADERS:
    raise ValueError(f"MATH_GRADER={GRADER!r} is not usable: choose one of {', '.join(GRADERS)} (agent.grader).")
GRADER_TIMEOUT_S = _setting("MATH_GRADER_TIMEOUT", "5", float, "give the grading bound in seconds, e.g. 5")
_PROCESSES = _setting("MATH_GRADER_PROCESSES", str(node_cpus()), int, "give a whole number of grader processes, e.g. 4")
_MEMORY_BYTES = _setting("MATH_GRADER_MEM_BYTES", str(1 << 30), int, "give bytes per grader, e.g. 1073741824")


@dataclass(frozen=True)
class Grade:
    correct: bool
    answer: str | None  # the extracted final answer, None when there was none
    timed_out: bool = False
    rejected: str | None = None  # the static screen that refused the answer
    grader_died: bool = False

    @property
    def missing_answer(self) -> bool:
        return self.answer is None

    def info(self) -> dict[str, int]:
        return {
            step_key(MISSING_ANSWER): int(self.missing_answer),
            step_key(GRADER_TIMEOUTS): int(self.timed_out),
            step_key(GRADER_REJECTED): int(self.rejected is not None),
            step_key(GRADER_RESTARTS): int(self.grader_died),
        }


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces) or ``\\boxed x``; None if absent."""
    matches = list(_BOXED.finditer(text))
    for match in reversed(matches):
        start = match.end()
        if start < len(text) and text[start] == "{":
            depth = 0
            for i in range(start, len(text)):
                if text[i] == "{":
                    depth += 1
                elif text[i] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[start + 1 : i].strip()
            continue  # unbalanced (cut off mid-answer): try an earlier one
        token = re.match(r"[^\s$]+", text[start:])
        if token:
            return token.group(0).rstrip(".")
    return None


POOL = GraderPool(_PROCESSES, _MEMORY_BYTES, GRADER)
atexit.register(POOL.close)


def _normalize(answer: str) -> str:
    answer = re.sub(r"\\(?:text|mathrm|textbf)\{([^{}]*)\}", r"\1", answer)
    answer = answer.replace("\\!", "").replace("\\,", "").replace("\\left", "").replace("\\right", "")
    answer = answer.replace("dfrac", "frac").replace("tfrac", "frac").replace("$", "")
    return re.sub(r"\s+", "", answer).rstrip(".").lower()


@dataclass(frozen=True)
class _Pending:
    answer: str
    future: concurrent.futures.Future
    deadline: float

    def wait_s(self) -> float:
        return max(0.0, self.deadline - time.monotonic()) + SLACK_S


def extract_answer(response: str) -> str | None:
    """The final answer that ``GRADER``'s rules read in ``response`` (None: there is none)."""
    return molt_math_rules.extract_answer(response) if GRADER == "molt" else last_boxed(response)


def _start(response: str, ground_truth: str, timeout_s: float) -> Grade | _Pending:
    """A Grade decided without a parser, or the pool's pending comparison."""
    answer = extract_answer(response)
    if answer is None:
        return Grade(correct=False, answer=None)
    if GRADER == "molt":
        # Molt's rules have no screens: only the grader processes' bounds stand in for them.
        if molt_math_rules.same_string(answer, ground_truth):
            return Grade(correct=True, answer=answer)
    else:
        if _normalize(answer) == _normalize(ground_truth):
            return Grade(correct=True, answer=answer)
        reason = screen(answer)
        if reason is not None:
            return Grade(correct=False, answer=answer, rejected=reason)
    deadline = time.monotonic() + timeout_s
    return _Pending(answer, POOL.submit(answer, ground_truth, deadline, COMPUTE_SHARE * timeout_s), deadline)


def _finish(answer: str, verdict: Verdict | None) -> Grade:
    return Grade(
        correct=verdict is Verdict.CORRECT,
        answer=answer,
        timed_out=verdict in (None, Verdict.TIMED_OUT),
        grader_died=verdict is Verdict.DIED,
    )


def grade(response: str, ground_truth: str, timeout_s: float = GRADER_TIMEOUT_S) -> Grade:
    """Grade the last boxed answer of ``response`` against ``ground_truth`` (blocking)."""
    started = _start(response, str(ground_truth), timeout_s)
    if isinstance(started, Grade):
        return started
    try:
        verdict = started.future.result(timeout=started.wait_s())
    except concurrent.futures.TimeoutError:
        started.future.cancel()
        verdict = None
    return _finish(started.answer, verdict)


async def grade_async(response: str, ground_truth: str, timeout_s: float = GRADER_TIMEOUT_S) -> Grade:
    """``grade`` for an event loop: the wait for the pool's verdict does not hold a thread."""
    started = _start(response, str(ground_truth), timeout_s)
    if isinstance(started, Grade):
        return started
    try:
        verdict = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(started.future)), started.wait_s())
    except asyncio.TimeoutError:
        started.future.cancel()
        verdict = None
    return _finish(started.answer, verdict)
