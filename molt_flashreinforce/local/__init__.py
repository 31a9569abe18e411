"""The embedded CPU backend (`backend=local`): FlashREINFORCE, or the GRPO baseline, training a
tiny GPT-2 with random weights on an addition task the package generates, with rollouts from a
policy snapshot exactly `local.policy_lag` updates old. See docs/local.md.

    summary = molt_flashreinforce.local.run(cfg, run_dir)   # cfg: composed Hydra config

Modules: config (the `local:` node), task, model, sampler (KV cache, stored log-probs),
snapshots (lag-k), objective (Molt's estimator + PolicyLoss, or the torch fallback), trainer,
checkpoint, runner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def run(cfg: Any, run_dir: str | Path) -> dict[str, Any]:
    """Train (or resume) in `run_dir`; returns the summary also written to run_dir/summary.json."""
    from molt_flashreinforce.local.runner import run as run_local

    return run_local(cfg, run_dir)


__all__ = ["run"]
