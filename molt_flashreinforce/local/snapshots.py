"""Lag-k policy snapshots: asynchrony in miniature.

In an asynchronous RL system the trainer consumes batches that a rollout worker sampled with
weights several updates old. Here that lag is exact: `PolicySnapshots(lag)` keeps the weights
of the last `lag + 1` policy versions (version v = the weights after v optimizer steps), and
the batch for update v is sampled by version `behavior_version(v) = max(0, v - lag)`. The
first `lag` updates see version 0, as a queue filled by the initial weights would.
"""

from __future__ import annotations

import torch


class PolicySnapshots:
    def __init__(self, lag: int) -> None:
        if lag < 0:
            raise ValueError(f"policy lag must be >= 0, got {lag}")
        self.lag = lag
        self._weights: dict[int, dict[str, torch.Tensor]] = {}

    def behavior_version(self, version: int) -> int:
        return max(0, version - self.lag)

    def record(self, version: int, policy: torch.nn.Module) -> None:
        """Store the weights of `version` (the policy after `version` updates) and forget those
        no later update samples from: the next update, number `version`, needs behavior_version(version)."""
        self._weights[version] = {k: v.detach().clone() for k, v in policy.state_dict().items()}
        oldest_needed = self.behavior_version(version)
        for old in [v for v in self._weights if v < oldest_needed]:
            del self._weights[old]

    def load_into(self, behavior: torch.nn.Module, version: int) -> None:
        if version not in self._weights:
            raise KeyError(f"no snapshot of policy version {version}; held: {sorted(self._weights)}")
        behavior.load_state_dict(self._weights[version])

    def versions(self) -> list[int]:
        return sorted(self._weights)

    def state_dict(self) -> dict:
        return {"lag": self.lag, "weights": self._weights}

    def load_state_dict(self, state: dict) -> None:
        if state["lag"] != self.lag:
            raise ValueError(f"checkpoint was written with policy_lag={state['lag']}, this run has {self.lag}")
        self._weights = state["weights"]
