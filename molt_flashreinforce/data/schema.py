"""The rows this package writes for Molt, and their validation.

Math rows (``--data.input_key prompt --data.label_key reward_model``)::

    {"prompt": [{"role": "user", "content": "..."}], "reward_model": {"ground_truth": "..."},
     "datasource": "amc23"}

ALFWorld rows (``--data.label_key game_file``; the path is relative to ``ALFWORLD_DATA``)::

    {"prompt": [...], "game_file": "json_2.1.1/train/.../game.tw-pddl", "datasource": "alfworld_train"}

``datasource`` names the benchmark in Molt's eval tags (``eval/eval_<datasource>_pass1``), so it
must be a plain identifier. ``validate_row`` raises ``MalformedRowError`` naming the row.
"""

from __future__ import annotations

import re

ROLES = ("system", "user", "assistant")
_DATASOURCE = re.compile(r"^[a-z0-9_]+$")


class MalformedRowError(ValueError):
    """A source or output row that cannot become a valid Molt row; names where it is."""


def validate_row(row: dict, label_key: str, where: str) -> None:
    """Check one output row; ``where`` is e.g. ``"train.jsonl row 12"``."""

    def fail(problem: str):
        raise MalformedRowError(f"{where}: {problem}")

    if not isinstance(row, dict):
        fail(f"expected a JSON object, got {type(row).__name__}")
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        fail("'prompt' must be a non-empty list of chat messages")
    for i, message in enumerate(prompt):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            fail(f"prompt message {i} must be an object with exactly 'role' and 'content'")
        if message["role"] not in ROLES:
            fail(f"prompt message {i} has role {message['role']!r}; use one of {', '.join(ROLES)}")
        if not isinstance(message["content"], str) or not message["content"].strip():
            fail(f"prompt message {i} has empty or non-string content")
    if prompt[-1]["role"] != "user":
        fail("the last prompt message must be the user's")
    if label_key == "reward_model":
        reward_model = row.get("reward_model")
        truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
        if not isinstance(truth, str) or not truth.strip():
            fail("'reward_model.ground_truth' must be a non-empty string")
    elif label_key == "game_file":
        if not isinstance(row.get("game_file"), str) or not row["game_file"].endswith(".tw-pddl"):
            fail("'game_file' must be the path of an ALFWorld .tw-pddl game")
    else:
        raise ValueError(f"unknown label key {label_key!r}")
    datasource = row.get("datasource")
    if not isinstance(datasource, str) or not _DATASOURCE.match(datasource):
        fail(f"'datasource' must be lower-case letters, digits and '_' (it names eval tags), got {datasource!r}")
