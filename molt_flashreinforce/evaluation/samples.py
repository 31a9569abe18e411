"""One evaluated sample as a JSON line, and ``samples.jsonl``, which makes an evaluation resumable.

Contract: ``sample_record(task, trajectory, decode, agent_kind)`` turns a finished Molt
``Trajectory`` into the record ``eval_record.SAMPLE_KEYS`` names, plus ``ground_truth`` and
``truncated``; ``SampleLog(path)`` holds the file: ``finished()`` reads the samples already there
(a line cut off by a kill is dropped, and cut from the file), ``append(record)`` writes one more
and flushes it, so a killed evaluation loses at most the samples in flight.

A sample is identified by (benchmark, problem_id, sample_index): ``problem_id`` is the problem's
position among its benchmark's rows in the eval file, ``sample_index`` in 0..k-1.

``verdict``: ``correct`` / ``wrong`` (graded), ``no_answer`` (no final answer to grade),
``timed_out`` / ``rejected`` / ``grader_died`` (the strict grader's bound, screens, a crash),
``turn_limit`` (the agent's turns ran out), ``out_of_context`` (the context ran out before the
episode ended); ALFWorld: ``won``, ``not_won``, ``turn_limit``. ``extracted_answer`` is what the
grader compared (the ALFWorld agent's last command), None when there was none.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

SampleKey = tuple[str, int, int]


@dataclass(frozen=True)
class SampleTask:
    benchmark: str
    problem_id: int
    sample_index: int
    prompt: str  # rendered with the model's chat template, as Molt's dataset renders it
    label: Any  # the row's label (molt.data.label_key), as Molt hands it to the agent
    ground_truth: str  # printable form of the label

    @property
    def key(self) -> SampleKey:
        return (self.benchmark, self.problem_id, self.sample_index)


def key_of(record: dict) -> SampleKey:
    return (record["benchmark"], int(record["problem_id"]), int(record["sample_index"]))


def _number(value) -> float:
    return float(value.item() if hasattr(value, "item") else value)


def _verdict_and_answer(agent_kind: str | None, reward: float, info: dict, final_action: str) -> tuple[str, str | None]:
    if agent_kind == "alfworld":
        from molt_flashreinforce.agents.alfworld_protocol import parse_action

        verdict = "won" if reward > 0 else "turn_limit" if info.get("turn_limit_reached") else "not_won"
        return verdict, parse_action(final_action)
    if agent_kind == "python_tool":
        from molt_flashreinforce.agents.python_tool_protocol import parse_tool_calls

        if parse_tool_calls(final_action):  # its last turn asked for tools: nothing was graded
            return ("turn_limit" if info.get("turn_limit_reached") else "out_of_context"), None
    from molt_flashreinforce.agents.grading import extract_answer

    answer = extract_answer(final_action)
    if reward > 0:
        return "correct", answer
    for flag, verdict in (("grader_timeouts", "timed_out"), ("grader_rejected", "rejected"),
                          ("grader_restarts", "grader_died")):
        if info.get(flag):
            return verdict, answer
    return ("no_answer" if answer is None else "wrong"), answer


def sample_record(task: SampleTask, trajectory, decode: Callable[[list[int]], str], agent_kind: str | None) -> dict:
    tokens = trajectory.observation_tokens
    ranges = trajectory.action_ranges
    response = decode(tokens[ranges[0][0]:]) if ranges else ""
    final_action = decode(tokens[ranges[-1][0]:ranges[-1][1]]) if ranges else ""
    info = {name: _number(value) for name, value in (trajectory.extra_logs or {}).items()
            if isinstance(value, (int, float)) or hasattr(value, "item")}
    reward = _number(trajectory.reward)
    verdict, answer = _verdict_and_answer(agent_kind, reward, info, final_action)
    record = {
        "benchmark": task.benchmark, "problem_id": task.problem_id, "sample_index": task.sample_index,
        "response": response, "extracted_answer": answer, "reward": reward, "verdict": verdict,
        "turns": int(info.get("turns", len(ranges))),
        "tool_calls": int(info["tool_calls"]) if "tool_calls" in info else None,
        "ground_truth": task.ground_truth, "truncated": bool(trajectory.truncated),
    }  # fmt: skip
    return record


class SampleLog:
    def __init__(self, path: Path):
        self.path = path
        self._handle = None

    def finished(self) -> dict[SampleKey, dict]:
        """The samples written so far; a last line cut off mid-write is removed from the file."""
        if not self.path.is_file():
            return {}
        records: dict[SampleKey, dict] = {}
        good_bytes = 0
        with self.path.open("rb") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                    key = key_of(record)
                except (ValueError, KeyError, TypeError):
                    break
                if not line.endswith(b"\n"):
                    break
                records[key] = record
                good_bytes += len(line)
        if good_bytes != self.path.stat().st_size:
            with self.path.open("r+b") as handle:
                handle.truncate(good_bytes)
        return records

    def append(self, record: dict) -> None:
        if self._handle is None:
            self._handle = self.path.open("a", encoding="utf-8")
        self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()
            self._handle = None
