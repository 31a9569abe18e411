"""The local backend's advantage estimator + policy loss, through Molt when Molt is installed.

    objective = build_objective(cfg.algo)
    advantages = objective.advantages(rewards, mask)            # [B, T], A_i * mask
    loss, stats = objective.loss(log_probs, rollouts, advantages, rewards, entropies)

With Molt importable both algorithms run Molt's own code path: the advantage comes from Molt's
estimator registry (`flashreinforce`, registered by our plugin, or Molt's `grpo`) with
`AdvantageContext(no_whiten=True)`, and the loss is the Molt `PolicyLoss` our plugin builds
(`FlashReinforcePolicyLoss`, or the stock PPO/token-mean loss for GRPO), called with Molt's
forward keywords. `old_log_probs` is the current forward detached, as Molt does with one update
per batch, so the only off-policy correction is the one each algorithm defines against the
stored sampling log-probs. Without Molt, FlashREINFORCE falls back to the pure-torch
`molt_flashreinforce.objective`; GRPO has no fallback.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import torch

from molt_flashreinforce.local.sampler import Rollouts
from molt_flashreinforce.objective import FlashReinforceConfig, batch_mean_advantages, flashreinforce_loss

ALGORITHMS = ("flashreinforce", "grpo")


class ObjectiveError(ValueError):
    """The `algo` node cannot be run by the local backend."""


@dataclass(frozen=True)
class LossStats:
    policy_loss: float
    accepted: torch.Tensor | None  # [B] bool per trajectory (sequence gate), None without a gate
    acceptance_rate: float | None
    sequence_kl: torch.Tensor | None  # [B] the gate statistic
    retained_token_fraction: float | None


def molt_available() -> bool:
    return importlib.util.find_spec("molt") is not None


def _algo_value(algo: Any, key: str, default: Any = None) -> Any:
    return algo.get(key, default) if hasattr(algo, "get") else getattr(algo, key, default)


def build_objective(algo: Any, use_molt: bool | None = None):
    name = _algo_value(algo, "name")
    if name not in ALGORITHMS:
        raise ObjectiveError(f"algo.name={name!r} is not supported by backend=local; use one of {ALGORITHMS}")
    use_molt = molt_available() if use_molt is None else use_molt
    if use_molt:
        return MoltObjective(algo)
    if name == "flashreinforce":
        return TorchFlashReinforce(algo)
    raise ObjectiveError(
        "algo=grpo on backend=local runs Molt's PolicyLoss and GRPO estimator, but Molt is not importable; "
        "install it (scripts/setup.sh on CPU, or pip install 'molt-flashreinforce[molt]') or use algo=flashreinforce"
    )


def _group_size(algo: Any) -> int:
    size = int(_algo_value(algo, "group_size", 1))
    name = _algo_value(algo, "name")
    if name == "flashreinforce" and size != 1:
        raise ObjectiveError(f"FlashREINFORCE samples one rollout per prompt; algo.group_size must be 1, got {size}")
    if name == "grpo" and size < 2:
        raise ObjectiveError(f"GRPO needs algo.group_size >= 2 to form a group baseline, got {size}")
    return size


class MoltObjective:
    """Molt's estimator registry and `PolicyLoss`, called exactly as Molt's trainer and actor do."""

    def __init__(self, algo: Any) -> None:
        from molt.trainer.algorithm.advantage import AdvantageContext, get_advantage_estimator

        from molt_flashreinforce.plugin import build_policy_loss, register

        register()
        self.name = _algo_value(algo, "name")
        self.group_size = _group_size(algo)
        self._context_cls = AdvantageContext
        self._estimator = get_advantage_estimator(self.name)
        self._loss_fn = build_policy_loss(algo)
        self.needs_entropies = self.name == "flashreinforce" and self._loss_fn.config.uses_entropy_filter

    def advantages(self, rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch = rewards.shape[0]
        groups = [list(range(start, start + self.group_size)) for start in range(0, batch, self.group_size)]
        context = self._context_cls(
            sample_to_rollout=torch.arange(batch, device=rewards.device),
            exp_len=[batch],
            action_masks=[mask],
            kl_coef=0.0,
            gamma=1.0,
            lam=1.0,
            kls=[torch.zeros(mask.shape, device=mask.device)],
            no_whiten=True,
        )
        advantages, _ = self._estimator(rewards.float(), groups, context)
        return advantages[0]

    def loss(self, log_probs, rollouts: Rollouts, advantages, rewards, entropies=None):
        mask = rollouts.mask
        keywords = dict(
            old_log_probs=log_probs.detach(),
            advantages=advantages,
            action_mask=mask,
            rollout_log_probs=rollouts.log_probs,
            global_batch_size=torch.tensor(mask.shape[0], device=mask.device),
            batch_num_tokens=mask.sum(),
        )
        if self.name != "flashreinforce":
            loss, reported, *_ = self._loss_fn(log_probs, **keywords)
            return loss, LossStats(float(reported), None, None, None, None)
        loss, reported, *_ = self._loss_fn(log_probs, **keywords, failures=rewards <= 0, entropies=entropies)
        return loss, _flashreinforce_stats(float(reported), self._loss_fn.last_stats)


class TorchFlashReinforce:
    """The pure-torch objective, for machines without Molt."""

    name = "flashreinforce"

    def __init__(self, algo: Any) -> None:
        self.group_size = _group_size(algo)
        self._config = FlashReinforceConfig.from_algo(algo)
        self.needs_entropies = self._config.uses_entropy_filter

    def advantages(self, rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return batch_mean_advantages(rewards.float())[:, None] * mask

    def loss(self, log_probs, rollouts: Rollouts, advantages, rewards, entropies=None):
        out = flashreinforce_loss(log_probs, rollouts.log_probs, rewards.float(), rollouts.mask, self._config,
                                  failures=rewards <= 0, entropies=entropies)
        reported = -(out.token_weights * rollouts.mask).sum() / rollouts.mask.sum()
        return out.loss, _flashreinforce_stats(float(reported), out.stats)


def _flashreinforce_stats(policy_loss: float, stats) -> LossStats:
    return LossStats(
        policy_loss=policy_loss,
        accepted=stats.admitted,
        acceptance_rate=float(stats.acceptance_rate),
        sequence_kl=stats.sequence_kl,
        retained_token_fraction=float((stats.retained_tokens / stats.policy_tokens).mean()),
    )
