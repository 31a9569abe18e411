"""FlashREINFORCE as Molt policy losses.

Two layers, both under Molt's loss name `flashreinforce`:

* `flashreinforce_surrogate`, registered in Molt's `POLICY_LOSSES`: the per-token REINFORCE
  surrogate -sg(ratio) * A * log pi. Inside Molt's stock `PolicyLoss` with the recipe flags
  (IS level seq, gating binary_kl, mode mask, threshold delta, seq-mean-token-mean) it is the
  paper's default method, since Molt multiplies it by the detached pi_old/mu ratio of admitted
  trajectories.
* `FlashReinforcePolicyLoss`, a `PolicyLoss` subclass that Molt's actors use when
  `--actor.loss_mode flashreinforce` (installed by `plugin.registry`). It computes the whole
  objective with `objective.flashreinforce_policy_loss`, so every ablation (token gate,
  geometric gate, token-mean and constant-length reductions, no-IS, entropy filter q) runs with
  Molt's own inputs. It keeps `PolicyLoss.forward`'s keywords and 6-tuple return.

Inside Molt the loss sees one micro-batch at a time: advantages were centred over the whole
batch by the estimator, and `global_batch_size` / `batch_num_tokens` carry the optimizer-step
window's counts, so the micro-batch losses add up to the batch objective. `dp_size` undoes
FSDP's gradient averaging across data-parallel ranks, as in Molt's `agg_loss`.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

import torch
from molt.models.loss import PolicyLoss
from molt.models.utils import masked_mean

from molt_flashreinforce import metrics
from molt_flashreinforce.objective import FlashReinforceConfig, flashreinforce_policy_loss
from molt_flashreinforce.plugin.cli_flags import recipe_loss_kwargs

LOSS_NAME = "flashreinforce"


def flashreinforce_surrogate(ratio, advantages, log_probs, action_mask, **_):
    """REINFORCE through log pi, weighted by the detached, unclipped policy ratio. Non-policy slots
    are zeroed before Molt's masked sum, where NaN or -inf padding would survive 0 * x."""
    loss = -ratio.detach() * advantages * log_probs
    if action_mask is not None:
        loss = torch.where(action_mask.bool(), loss, 0.0)
    return loss, torch.zeros((), device=loss.device)


class FlashReinforcePolicyLoss(PolicyLoss):
    """Molt `PolicyLoss` whose forward is the full FlashREINFORCE objective."""

    def __init__(self, config: FlashReinforceConfig, **molt_kwargs: Any) -> None:
        molt_kwargs["loss_mode"] = LOSS_NAME
        super().__init__(**molt_kwargs)  # Molt's own argument validation still runs
        if config.importance_sampling and self.is_correction_level == "off":
            raise ValueError(
                "FlashREINFORCE's importance ratio needs the sampling log-probs, which Molt stores only when "
                "--algo.advantage.is_correction_level is not off; set it to seq (the recipe configuration)."
            )
        threshold = self.is_correction_threshold
        if threshold is not None and float(threshold[-1]) != config.delta:
            raise ValueError(
                f"--algo.advantage.is_correction_threshold {threshold[-1]} disagrees with the FlashREINFORCE delta "
                f"{config.delta}: the trust region is configured twice. Set only algo.delta (the launcher renders "
                "the Molt threshold from it)."
            )
        if self.loss_agg_mode == "token-mean" and config.reduction != "token_mean":
            # Molt's PolicyTrainer passes the window's sequence count only for the seq-mean modes
            # (global_batch_size=None under token-mean), and the micro-batch is not the batch.
            raise ValueError(
                f"--actor.loss_agg_mode token-mean gives FlashREINFORCE no batch size, which reduction="
                f"{config.reduction} divides by; use --actor.loss_agg_mode seq-mean-token-mean (the launcher "
                "renders it) and choose the reduction with algo.reduction / --flashreinforce.reduction."
            )
        self.config = config
        self.bound_experience = None  # set by the patched PolicyTrainer.training_step
        self.bound_entropies = None
        self.last_stats = None  # the latest call's FlashReinforceStats, for callers outside Molt

    def forward(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: Optional[torch.Tensor] = None,
        rollout_log_probs: Optional[torch.Tensor] = None,
        dp_size: int = 1,
        batch_num_tokens: Optional[torch.Tensor] = None,
        global_batch_size: Optional[torch.Tensor] = None,
        prompt_token_counts: Optional[torch.Tensor] = None,
        top_log_probs: Optional[torch.Tensor] = None,
        rollout_top_log_probs: Optional[torch.Tensor] = None,
        *,
        failures: Optional[torch.Tensor] = None,
        entropies: Optional[torch.Tensor] = None,
    ):
        if action_mask is None:
            raise ValueError("FlashREINFORCE needs action_mask: T_i is each trajectory's own policy-token count")
        mask = action_mask.bool()
        if rollout_log_probs is None:
            if self.config.importance_sampling:
                raise ValueError("FlashREINFORCE needs rollout_log_probs (the stored sampling log-probs)")
            rollout_log_probs = log_probs.detach()
        if self.config.uses_entropy_filter:
            failures = failures if failures is not None else self._bound_failures()
            entropies = entropies if entropies is not None else self.bound_entropies
        out = flashreinforce_policy_loss(
            log_probs,
            rollout_log_probs,
            _row_values(advantages, mask),
            mask,
            self.config,
            failures=failures,
            entropies=entropies,
            batch_size=global_batch_size,
            batch_tokens=batch_num_tokens,
        )
        stats = self.last_stats = out.stats
        loss = out.loss * dp_size
        reported_loss = masked_mean(-out.token_weights, mask, dim=None)
        clip_ratio = torch.zeros((), device=loss.device)  # nothing is clipped
        policy_kl = masked_mean(-(log_probs.detach().float() - old_log_probs.detach().float()), mask, dim=None)
        vllm_kl = masked_mean(
            torch.nan_to_num(rollout_log_probs.float() - old_log_probs.detach().float(), nan=0.0,
                             posinf=30.0, neginf=-30.0), mask, dim=None)
        if self.config.gate_level == "sequence":
            # One flag per trajectory, like Molt's seq level: the actor then weights it by samples.
            is_filter_ratio = (~stats.admitted).float()
        else:
            is_filter_ratio = 1.0 - stats.acceptance_rate.float()
        self._log_to_experience(stats)
        return loss, reported_loss, clip_ratio, policy_kl, vllm_kl, is_filter_ratio

    def _bound_failures(self) -> Optional[torch.Tensor]:
        if self.bound_experience is None or "reward" not in self.bound_experience.info:
            return None
        # A failed trajectory is one whose reward is not positive (0/1 task rewards: the zeros).
        return torch.as_tensor(self.bound_experience.info["reward"]).reshape(-1) <= 0

    def _log_to_experience(self, stats) -> None:
        if self.bound_experience is None:
            return
        info = self.bound_experience.info
        # Per-sample vectors: Molt logs each numeric info key as train/<key>, sample-weighted.
        info[metrics.step_key(metrics.ACCEPTANCE_RATE)] = stats.admitted.float()
        info[metrics.step_key(metrics.SEQUENCE_KL_MEAN)] = stats.sequence_kl.float()
        info[metrics.step_key(metrics.RETAINED_TOKEN_FRACTION)] = (stats.retained_tokens / stats.policy_tokens).float()


def _row_values(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Molt broadcasts each row's scalar advantage over its policy tokens; read it back exactly."""
    first_policy_token = mask.int().argmax(dim=-1, keepdim=True)
    return advantages.gather(-1, first_policy_token).squeeze(-1)


def config_from_args(args: SimpleNamespace) -> FlashReinforceConfig:
    """Our knobs from the `--flashreinforce.*` flags; without them (stock CLI), the paper's defaults
    with Molt's threshold as delta."""
    knobs = getattr(args, "flashreinforce", None)
    if knobs is not None:
        return FlashReinforceConfig.from_algo(knobs)
    return FlashReinforceConfig(delta=float(args.algo.advantage.is_correction_threshold[-1]))


def policy_loss_from_args(args: SimpleNamespace) -> PolicyLoss:
    """Exactly the loss module a Molt `PolicyModelActor` builds from these (validated) arguments.
    Constructing it in the driver surfaces the checks Molt's CLI skips before any GPU starts."""
    from molt_flashreinforce.plugin.seams import fused_head_args_refusal, policy_loss_kwargs

    kwargs = policy_loss_kwargs(args)
    if args.actor.loss_mode == LOSS_NAME:
        refusal = args.flashreinforce.fused_head and fused_head_args_refusal(args)
        if refusal:
            raise ValueError(refusal)
        return FlashReinforcePolicyLoss(config_from_args(args), **kwargs)
    return PolicyLoss(**kwargs)


def build_policy_loss(algo: Any) -> PolicyLoss:
    """The Molt loss module for a Hydra `algo` node, for callers that run Molt's loss outside its
    actors (the local CPU backend): FlashREINFORCE in its recipe configuration plus our knobs, or
    the GRPO baseline's PPO surrogate with token-mean reduction and no behaviour correction."""
    name = algo.get("name") if hasattr(algo, "get") else algo.name
    if name == LOSS_NAME:
        config = FlashReinforceConfig.from_algo(algo)
        return FlashReinforcePolicyLoss(config, **recipe_loss_kwargs(config.delta))
    if name == "grpo":
        clip = float(algo.get("clip_eps", 0.2) if hasattr(algo, "get") else algo.clip_eps)
        return PolicyLoss(clip_eps_low=clip, clip_eps_high=clip, loss_mode="ppo", loss_agg_mode="token-mean")
    raise ValueError(f"unknown algo {name!r}: expected 'flashreinforce' or 'grpo'")
