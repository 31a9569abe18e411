"""Patch Molt's classes once per process: `patch_once(targets, mark)`.

Each `(cls, patch)` of `targets` runs `patch(cls)` unless `cls` itself (not a base class) already
carries the attribute `mark`, then sets it; so every install of a runtime patch is idempotent, and
a subclass Ray captured is patched on its own even when its base was patched before.
"""

from __future__ import annotations

from typing import Callable, Iterable


def patch_once(targets: Iterable[tuple[type, Callable[[type], None]]], mark: str) -> None:
    for cls, patch in targets:
        if not cls.__dict__.get(mark):
            patch(cls)
            setattr(cls, mark, True)
