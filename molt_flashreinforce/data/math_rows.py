"""Turn a source math record into a Molt row (chat prompt, ground truth, datasource).

Field names differ between public copies, so the problem and the answer are looked up in a
fixed order (``PROBLEM_KEYS``, ``ANSWER_KEYS``); the first present, non-empty one wins. A
DAPO-Math prompt's "Answer:" instructions are stripped, since every prompt here asks for
``\\boxed{}`` (what the graders read). Prompt styles:

* ``boxed``: one user message, the problem plus ``BOXED_INSTRUCTION`` (unless it already asks
  for ``\\boxed``);
* ``python_tool``: the Python tool's system prompt, then the problem.
"""

from __future__ import annotations

import re

from molt_flashreinforce.agents.grading import last_boxed
from molt_flashreinforce.agents.python_tool_protocol import SYSTEM_PROMPT
from molt_flashreinforce.data.schema import MalformedRowError

PROBLEM_KEYS = ("problem", "question", "Problem", "Question", "prompt")
ANSWER_KEYS = ("reward_model.ground_truth", "answer", "final_answer", "ground_truth", "Answer", "solution")
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
STYLES = ("boxed", "python_tool")
_DAPO_HEAD = re.compile(r"^Solve the following math problem step by step\..*?\n\n", re.DOTALL)
_DAPO_TAIL = re.compile(r"\n\nRemember to put your answer on its own line after \"Answer:\"\.?\s*$")


def _lookup(record: dict, dotted: str):
    value = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def problem_text(record: dict, where: str) -> str:
    for key in PROBLEM_KEYS:
        value = record.get(key)
        if isinstance(value, list):  # chat messages: the last user turn
            users = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
            value = users[-1] if users else None
        if isinstance(value, str) and value.strip():
            return _DAPO_TAIL.sub("", _DAPO_HEAD.sub("", value.strip())).strip()
    raise MalformedRowError(f"{where}: no problem text (looked for {', '.join(PROBLEM_KEYS)})")


def _strip_math(text: str) -> str:
    return text.strip().strip("$").strip()


def answer_text(record: dict, where: str) -> str:
    for key in ANSWER_KEYS:
        value = _lookup(record, key)
        if isinstance(value, list):  # several answers (OlympiadBench): each may be in $...$
            value = ", ".join(_strip_math(str(v)) for v in value) if value else None
        if key == "solution" and isinstance(value, str):
            value = last_boxed(value)
        if isinstance(value, bool) or value is None:
            continue
        text = _strip_math(str(value))
        if text:
            return text
    raise MalformedRowError(f"{where}: no answer (looked for {', '.join(ANSWER_KEYS)})")


def prompt_messages(problem: str, style: str) -> list[dict]:
    if style == "boxed":
        content = problem if "\\boxed" in problem else f"{problem}\n\n{BOXED_INSTRUCTION}"
        return [{"role": "user", "content": content}]
    if style == "python_tool":
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": problem}]
    raise ValueError(f"unknown prompt style {style!r}; use one of {', '.join(STYLES)}")


def _renamed(raw, by_data_source: tuple[tuple[str, str], ...], where: str) -> str:
    known = dict(by_data_source)
    if raw not in known:
        names = ", ".join(f"{value!r} (-> {name})" for value, name in by_data_source)
        raise MalformedRowError(f"{where}: data_source {raw!r} is not a benchmark of this source; known: {names}")
    return known[raw]


def math_row(record: dict, where: str, style: str, datasource: str | None,
             by_data_source: tuple[tuple[str, str], ...] = ()) -> tuple[str, dict]:
    """(problem text, Molt row). ``datasource=None``: the record's own ``data_source``, renamed by
    ``by_data_source`` (a value it does not list is refused)."""
    problem = problem_text(record, where)
    if datasource is None:
        raw = record.get("data_source") or record.get("datasource")
        if not raw:
            raise MalformedRowError(f"{where}: no data_source field to name its benchmark")
        datasource = _renamed(raw, by_data_source, where)
    return problem, {
        "prompt": prompt_messages(problem, style),
        "reward_model": {"ground_truth": answer_text(record, where)},
        "datasource": datasource,
    }
