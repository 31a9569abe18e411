"""A shared store of finished warm starts, so that arms compared within a seed start from the
same policy without each repeating the supervised phase.

    path = cache_file(cfg, seed)           # None when cfg.warm_start.cache_dir is unset
    entry = load(path)                     # None when absent; else {"state": ..., "record": ...}
    store(path, trainer.warm_start_state(), record)

The file name is a hash of everything the warm start depends on (model, task, warm-start
schedule, device, seed), so a changed setting never picks up a stale entry. A stored warm start
is the policy after its supervised steps plus the prompt generator's state: loading it leaves the
trainer exactly as running the warm start would have, so the RL phase is bit-for-bit the same.
Writes are atomic; two jobs storing the same entry write identical contents.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from molt_flashreinforce.local.checkpoint import load_checkpoint, save_atomically
from molt_flashreinforce.local.config import LocalConfig


def cache_file(cfg: LocalConfig, seed: int) -> Path | None:
    if cfg.warm_start.cache_dir is None:
        return None
    depends_on = {
        "model": dataclasses.asdict(cfg.model),
        "task": dataclasses.asdict(cfg.task),
        "warm_start": dataclasses.asdict(dataclasses.replace(cfg.warm_start, cache_dir=None)),
        "device": cfg.device,
        "seed": seed,
    }
    digest = hashlib.sha256(json.dumps(depends_on, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cfg.warm_start.cache_dir) / f"seed{seed}_{digest}.pt"


def load(path: Path | None) -> dict[str, Any] | None:
    return load_checkpoint(path) if path is not None and path.is_file() else None


def store(path: Path, state: dict[str, Any], record: dict[str, Any]) -> None:
    save_atomically({"state": state, "record": record}, path)
