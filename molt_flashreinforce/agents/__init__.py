"""Molt agents of this package and where their files are.

Molt loads an agent by file path (``--train.agent_path``) and executes it outside
``sys.modules``, so each agent file is a thin ``AgentRunner`` over importable modules here.
"""

from __future__ import annotations

import os

AGENT_KINDS = ("math", "python_tool", "alfworld")


def agent_path(kind: str) -> str:
    """Absolute path of the Molt agent file for ``kind`` (one of ``AGENT_KINDS``)."""
    if kind not in AGENT_KINDS:
        raise ValueError(f"Unknown agent kind {kind!r}: choose one of {', '.join(AGENT_KINDS)}.")
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{kind}.py")
