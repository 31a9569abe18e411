"""The ALFWorld agent's wire format: the prompt, the model's ``<action>`` and the hints it sees.

The dataset prompt (written by the data command) carries ``OBSERVATION_SLOT``; the agent's
``reset`` swaps it for the game's opening text, so the rendered chat prompt keeps the model's
own template. Every later observation is the game's reply plus the admissible commands.
"""

from __future__ import annotations

import re

OBSERVATION_SLOT = "{{alfworld_observation}}"
MAX_ADMISSIBLE_HINTS = 30  # as in Molt's ALFWorld example; the game lists up to ~50
INSTRUCTIONS = (
    "You are an agent acting in a text-based household (ALFWorld). Each turn, think briefly, then give "
    "exactly one command inside <action></action>, for example <action>go to countertop 1</action>. "
    "Choose from the admissible actions you are shown.\n\n" + OBSERVATION_SLOT
)
_BANNER = re.compile(r"^-= Welcome to TextWorld, ALFRED! =-\s*")
_ACTION = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)


def describe(observation: str, admissible: list[str]) -> str:
    """The game's text and up to ``MAX_ADMISSIBLE_HINTS`` admissible commands."""
    commands = [c for c in admissible if c != "help"][:MAX_ADMISSIBLE_HINTS]
    text = _BANNER.sub("", observation.strip())
    return f"{text}\n\nAdmissible actions: {', '.join(commands)}"


def parse_action(text: str) -> str | None:
    """The last ``<action>...</action>`` of ``text``, normalised like ALFWorld's commands."""
    found = _ACTION.findall(text)
    if not found:
        return None
    command = " ".join(found[-1].split()).lower()
    return command or None
