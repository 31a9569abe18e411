"""The ALFWorld agent's wire format: the prompt, the model's ``<action>`` and the hints it sees.

The dataset prompt (written by the data command, ``game_prompt``) carries ``OBSERVATION_SLOT``
and ends with a tag naming its game; the agent's ``reset`` removes the tag (``untagged``) and swaps
the slot for the game's opening text, so the rendered chat prompt keeps the model's own template
and the model never sees the tag. The tag is there because Molt tells an eval sample's
datasource by its prompt text (``rl_trainer.compute_eval_metrics``): with one text for every
game, seen and unseen games would all land under one eval tag. Every later observation is the
game's reply plus the admissible commands.
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
_GAME_TAG = "\n{{alfworld_game:%s}}"
_GAME_TAG_PATTERN = re.compile(r"\n\{\{alfworld_game:[^}]*\}\}")
_BANNER = re.compile(r"^-= Welcome to TextWorld, ALFRED! =-\s*")
_ACTION = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)


def game_prompt(game_file: str) -> str:
    """The user message of a dataset row: the instructions, the slot, and the game's tag."""
    return INSTRUCTIONS + _GAME_TAG % game_file


def untagged(prompt: str) -> str:
    """The prompt without its game tag (what the model is shown)."""
    return _GAME_TAG_PATTERN.sub("", prompt)


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
