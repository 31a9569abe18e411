"""Shape cards of the paper's models, shipped as data (`cards.yaml`).

`card(name_or_path)` returns the card of a model id (a local path whose last two components
are a known id also matches), or None. A card holds the architecture class, the config values
that decide shapes and context (`config`), the chat-template family and the special tokens.
`max_positions(name_or_path)` is the card's native context, for checks made before a launch.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import PurePath
from typing import Any

import yaml


@functools.lru_cache(maxsize=1)
def cards() -> dict[str, dict[str, Any]]:
    text = (resources.files(__package__) / "cards.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def card(name_or_path: str) -> dict[str, Any] | None:
    known = cards()
    if name_or_path in known:
        return known[name_or_path]
    tail = "/".join(PurePath(name_or_path).parts[-2:])
    return known.get(tail)


def max_positions(name_or_path: str) -> int | None:
    found = card(name_or_path)
    return None if found is None else int(found["config"]["max_position_embeddings"])
