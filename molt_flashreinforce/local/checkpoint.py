"""Checkpoints of a local run: `<run_dir>/checkpoints/step_<version>.pt`.

    save_checkpoint(directory, version, state, keep_last)   # atomic; prunes older files
    save_atomically(state, path)                            # any torch file, written the same way
    latest_checkpoint(directory) -> Path | None

A checkpoint holds the trainer's state plus the run's progress record and a fingerprint of
the settings that must not change on resume (`check_resumable`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"^step_(\d+)\.pt$")


def _checkpoints(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), path) for path in directory.iterdir() if (m := _NAME.match(path.name))]
    return sorted(found)


def latest_checkpoint(directory: Path) -> Path | None:
    found = _checkpoints(directory)
    return found[-1][1] if found else None


def save_atomically(state: dict[str, Any], path: Path) -> None:
    """A crash mid-write never leaves a truncated file at `path`; writers racing on one path each
    write a partial file of their own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    torch.save(state, partial)
    os.replace(partial, path)


def save_checkpoint(directory: Path, version: int, state: dict[str, Any], keep_last: int) -> Path:
    path = directory / f"step_{version:06d}.pt"
    save_atomically(state, path)
    for _, old in _checkpoints(directory)[:-keep_last]:
        old.unlink()
    return path


def load_checkpoint(path: Path) -> dict[str, Any]:
    # The checkpoint holds torch RNG states and plain containers written by this package.
    return torch.load(path, map_location="cpu", weights_only=False)


def check_resumable(saved: dict[str, Any], current: dict[str, Any], path: Path) -> None:
    """Refuse to continue a run whose algorithm, model, task or batch settings changed."""
    changed = sorted(key for key in set(saved) | set(current) if saved.get(key) != current.get(key))
    if changed:
        details = "; ".join(f"{key}: {saved.get(key)!r} -> {current.get(key)!r}" for key in changed)
        raise ValueError(
            f"{path} was written with different settings ({details}). Resume with the original settings "
            "(only local.steps, local.eval, local.checkpoint and local.progress_bar may change) "
            "or use a new run directory."
        )
