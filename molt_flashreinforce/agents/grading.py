"""0/1 grading of a model's final ``\\boxed{}`` answer against a ground truth, with a wall-clock bound.

Contract: ``grade(response, ground_truth, timeout_s) -> Grade``. The answer is the content of
the **last** ``\\boxed{...}`` (or ``\\fbox{...}``) in ``response``; none means incorrect with
``missing_answer``. Equivalence is decided by ``math-verify`` (symbolic and numeric, e.g.
``\\frac{1}{2}`` = ``0.5``, ``2\\sqrt{2}`` = ``\\sqrt{8}``) with its own signal-based timeouts
turned off, since ``signal.alarm`` only works on the main thread and Molt grades inside Ray
actors' event loops. Instead each comparison runs in a long-lived grader process that is
killed and replaced when it overruns ``timeout_s``; an overrun grades as incorrect with
``timed_out``. ``grade`` blocks; ``await grade_async(...)`` runs it on this module's own
thread pool, so waiting graders never crowd out the event loop's default executor.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import json
import os
import queue
import re
import select
import subprocess
import sys
import threading
from dataclasses import dataclass

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")
GRADER_TIMEOUT_S = float(os.environ.get("MATH_GRADER_TIMEOUT", "5"))


@dataclass(frozen=True)
class Grade:
    correct: bool
    answer: str | None  # the extracted final answer, None when there was none
    timed_out: bool = False

    @property
    def missing_answer(self) -> bool:
        return self.answer is None


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


def _normalize(answer: str) -> str:
    answer = re.sub(r"\\(?:text|mathrm|textbf)\{([^{}]*)\}", r"\1", answer)
    answer = answer.replace("\\!", "").replace("\\,", "").replace("\\left", "").replace("\\right", "")
    answer = answer.replace("dfrac", "frac").replace("tfrac", "frac").replace("$", "")
    return re.sub(r"\s+", "", answer).rstrip(".").lower()


def equivalent(answer: str, ground_truth: str) -> bool:
    """math-verify equivalence without its signal-based timeouts (call under a wall-clock bound)."""
    if _normalize(answer) == _normalize(ground_truth):
        return True
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    gold = parse(f"${ground_truth}$", configs, parsing_timeout=None)
    pred = parse(f"${answer}$", configs, parsing_timeout=None)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=None))


def _serve():
    """Grader process main loop: one JSON ``[answer, ground_truth]`` per stdin line, one
    JSON verdict per stdout line."""
    import math_verify  # noqa: F401 - paid once, before the first timed request

    print(json.dumps("ready"), flush=True)
    for line in sys.stdin:
        answer, ground_truth = json.loads(line)
        try:
            verdict = equivalent(answer, ground_truth)
        except Exception:  # noqa: BLE001 - an unparsable answer is simply not equivalent
            verdict = False
        print(json.dumps(verdict), flush=True)


class _Grader:
    """One grader process (``python -m molt_flashreinforce.agents.grading``) and its pipes."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        if self._read(startup_timeout_s := 120.0) != "ready":
            self.close()
            raise RuntimeError(
                f"The math grader process did not start within {startup_timeout_s:.0f} s: "
                "is math-verify installed (pip install 'molt-flashreinforce[agents]')?"
            )

    def _read(self, timeout_s: float):
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        if not ready:
            return None
        line = self.process.stdout.readline()
        return json.loads(line) if line else None

    def ask(self, answer: str, ground_truth: str, timeout_s: float) -> bool | None:
        """The verdict, or None when the process overran ``timeout_s`` (it is then killed)."""
        self.process.stdin.write(json.dumps([answer, ground_truth]) + "\n")
        verdict = self._read(timeout_s)
        if verdict is None:
            self.close()
        return verdict

    def close(self):
        self.process.kill()
        self.process.wait()
        self.process.stdin.close()
        self.process.stdout.close()


class _GraderPool:
    """A few lazily started grader processes shared by every thread of this process."""

    def __init__(self, size: int):
        self.idle: queue.LifoQueue[_Grader] = queue.LifoQueue()
        self.slots = threading.Semaphore(size)

    def ask(self, answer: str, ground_truth: str, timeout_s: float) -> bool | None:
        with self.slots:
            try:
                grader = self.idle.get_nowait()
            except queue.Empty:
                grader = _Grader()
            verdict = grader.ask(answer, ground_truth, timeout_s)
            if verdict is not None:
                self.idle.put(grader)
            return verdict

    def close_idle(self) -> None:
        while True:
            try:
                self.idle.get_nowait().close()
            except queue.Empty:
                return


_GRADER_PROCESSES = int(os.environ.get("MATH_GRADER_PROCESSES", "2"))
_POOL = _GraderPool(_GRADER_PROCESSES)
# The graders would also exit on their own once this process's end of their stdin closes;
# stopping them explicitly keeps the exit orderly.
atexit.register(_POOL.close_idle)
_THREADS = concurrent.futures.ThreadPoolExecutor(max_workers=4 * _GRADER_PROCESSES, thread_name_prefix="math-grade")


def grade(response: str, ground_truth: str, timeout_s: float = GRADER_TIMEOUT_S) -> Grade:
    """Grade the last boxed answer of ``response`` against ``ground_truth`` (blocking)."""
    answer = last_boxed(response)
    if answer is None:
        return Grade(correct=False, answer=None)
    if _normalize(answer) == _normalize(str(ground_truth)):
        return Grade(correct=True, answer=answer)
    verdict = _POOL.ask(answer, str(ground_truth), timeout_s)
    return Grade(correct=bool(verdict), answer=answer, timed_out=verdict is None)


async def grade_async(response: str, ground_truth: str, timeout_s: float = GRADER_TIMEOUT_S) -> Grade:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_THREADS, functools.partial(grade, response, ground_truth, timeout_s))


if __name__ == "__main__":
    _serve()
