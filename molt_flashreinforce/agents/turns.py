"""The per-episode turn limit of multi-turn agents, read from ``MAX_AGENT_TURNS``.

Molt's core reads no agent variable; ``MAX_AGENT_TURNS`` is the convention of Molt's
examples, and this package's launcher sets it per experiment (10 for the Python tool, 20 for
the MoE ablation, 50 for ALFWorld).
"""

from __future__ import annotations

import os


def max_agent_turns(default: int) -> int:
    raw = os.environ.get("MAX_AGENT_TURNS", str(default))
    try:
        turns = int(raw)
    except ValueError:
        turns = 0
    if turns < 1:
        raise ValueError(f"MAX_AGENT_TURNS must be a positive integer, got {raw!r}.")
    return turns
