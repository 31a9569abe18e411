"""The FlashREINFORCE objective in pure torch (no Molt import).

Contract, for a learner batch of B complete trajectories on one device:

    flashreinforce_loss(log_probs, behavior_log_probs, rewards, mask, config,
                        failures=None, entropies=None) -> FlashReinforceOutput
        log_probs           [B, T] float  log pi_theta of the sampled tokens (carries the graph)
        behavior_log_probs  [B, T] float  log mu: the log-probs stored when the tokens were sampled
        rewards             [B]    float  one scalar per trajectory
        mask                [B, T] bool   policy tokens (False on prompt, tool output, padding)
        failures            [B]    bool   explicit failure labels (entropy filter only)
        entropies           [B, T] float  full-vocabulary entropy per position (entropy filter only)

The math (paper defaults; each `FlashReinforceConfig` field is one of the paper's ablations):

    A_i   = R_i - mean_j R_j                    over the full batch, before any gating; detached
    d_it  = KL(Bern(p) || Bern(q)),  p = clamp(mu_it), q = clamp(pi_it) to [1e-6, 1 - 1e-6]
    m_i   = [ mean_{t in A_i} d_it <= delta ]   sequence trust region (inclusive)
    gate_mean=geometric: (prod_{t in A_i} d_it)^(1/T_i) in place of the arithmetic mean, exactly:
            it is 0 when any token's d_it is 0 (its two clamped probabilities agree), which
            admits the row at any delta >= 0. That is the paper's statistic, the geometric mean
            of the per-token proxy (its Table 16 ablation), taken literally; no floor decides it.
    importance_sampling=False: rho = 1 and the gate is skipped (every row admitted), as in the
            paper's no-IS ablation; the behaviour log-probs are still validated.
    rho   = exp(log pi - log mu)                detached, unclipped, only on admitted tokens
    L     = -(1/B) sum_i (1/T_i) sum_{t kept, m_i} rho_it * A_i * log pi_it

T_i is the row's original policy-token count and B the original batch size: rejected rows and
filtered tokens shrink the step, they never renormalise it. Values in non-policy slots are ignored
(NaN and inf included); a non-finite ratio on an admitted token raises. float64 inputs stay float64,
every other float dtype is promoted to float32 first.

`flashreinforce_policy_loss` is the same objective with the advantages already computed and the
denominators (B, total tokens) given by the caller: that is the form Molt needs, because it calls
the loss once per micro-batch of a larger optimizer-step window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, make_dataclass
from dataclasses import field as dataclass_field
from typing import Any, Mapping

import torch

from molt_flashreinforce.algo_settings import check_loss, check_value, loss_settings

PROBABILITY_CLAMP = 1e-6  # Molt clamps both probabilities to [1e-6, 1 - 1e-6] before the binary KL.
# ceil(q * T) in floating point: 0.9 * 10 = 9.000000000000002 must keep 9 tokens, not 10.
_CEIL_TOLERANCE = 1e-9

class _ConfigMethods:
    """What `FlashReinforceConfig` adds to its fields."""

    def __post_init__(self) -> None:
        # Each field's type, choices and range, then the rules between them (algo_settings.py).
        values = {s.name: check_value(s, getattr(self, s.name), "") for s in loss_settings()}
        check_loss(values)
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def uses_entropy_filter(self) -> bool:
        return self.entropy_filter_q < 1.0

    @classmethod
    def from_algo(cls, algo: Mapping[str, Any] | Any) -> "FlashReinforceConfig":
        """Build from a Hydra `algo` node, a dict or a namespace; keys that are not knobs are ignored."""
        get = algo.get if hasattr(algo, "get") else lambda key, default=None: getattr(algo, key, default)
        values = {}
        for field in fields(cls):
            value = get(field.name, None)
            if value is not None:
                values[field.name] = value
        return cls(**values)


# The algorithm's knobs, one field per loss setting of algo_settings.py (its default: the paper's
# method with the reference loss's delta).
FlashReinforceConfig = make_dataclass(
    "FlashReinforceConfig",
    [(s.name, s.type | None if s.optional else s.type, dataclass_field(default=s.default)) for s in loss_settings()],
    bases=(_ConfigMethods,), frozen=True, namespace={"__module__": __name__})
FlashReinforceConfig.__doc__ = "The algorithm's knobs (algo_settings.py). Defaults are the paper's method."


@dataclass(frozen=True)
class FlashReinforceStats:
    """Detached per-batch diagnostics."""

    advantages: torch.Tensor  # [B] A_i
    sequence_kl: torch.Tensor  # [B] the row's mean Bernoulli KL (geometric mean under gate_mean=geometric)
    admitted: torch.Tensor  # [B] bool: every policy token of the row passed the gate
    acceptance_rate: torch.Tensor  # () admitted rows / B (sequence gate) or admitted tokens / tokens (token gate)
    policy_tokens: torch.Tensor  # [B] T_i
    retained_tokens: torch.Tensor  # [B] tokens that carried gradient (admitted and kept by the filter)


@dataclass(frozen=True)
class FlashReinforceOutput:
    loss: torch.Tensor  # () differentiable with respect to log_probs only
    stats: FlashReinforceStats
    token_weights: torch.Tensor  # [B, T] detached rho * A on the active tokens, zero elsewhere


def batch_mean_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """A_i = R_i - mean(R) over the whole batch: no group, no critic, no std scaling."""
    return rewards - rewards.mean()


def flashreinforce_loss(
    log_probs: torch.Tensor,
    behavior_log_probs: torch.Tensor,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    config: FlashReinforceConfig = FlashReinforceConfig(),
    *,
    failures: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
) -> FlashReinforceOutput:
    """The FlashREINFORCE loss over one whole learner batch (see the module docstring)."""
    _check_log_prob_inputs(log_probs, behavior_log_probs, mask)
    rewards = _per_trajectory("rewards", rewards, log_probs)
    return _objective(log_probs, behavior_log_probs, batch_mean_advantages(rewards), mask, config,
                      failures=failures, entropies=entropies, batch_size=None, batch_tokens=None)


def flashreinforce_policy_loss(
    log_probs: torch.Tensor,
    behavior_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: FlashReinforceConfig = FlashReinforceConfig(),
    *,
    failures: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    batch_size: int | torch.Tensor | None = None,
    batch_tokens: int | torch.Tensor | None = None,
) -> FlashReinforceOutput:
    """The objective for a slice of a larger batch: `advantages` [B] are given (already centred over
    the whole batch) and `batch_size` / `batch_tokens` are the whole batch's trajectory and policy-token
    counts (default: this slice's). Summing the slices' losses gives the whole batch's loss exactly."""
    _check_log_prob_inputs(log_probs, behavior_log_probs, mask)
    advantages = _per_trajectory("advantages", advantages, log_probs)
    return _objective(log_probs, behavior_log_probs, advantages, mask, config, failures=failures,
                      entropies=entropies, batch_size=batch_size, batch_tokens=batch_tokens)


# ──────────────── implementation ────────────────


def _compute_dtype(log_probs: torch.Tensor) -> torch.dtype:
    # exp() of a bf16/fp16 log-prob difference loses the ratio entirely; float64 stays exact.
    return torch.float64 if log_probs.dtype == torch.float64 else torch.float32


def _check_log_prob_inputs(log_probs: torch.Tensor, behavior_log_probs: torch.Tensor, mask: torch.Tensor) -> None:
    if log_probs.dim() != 2 or log_probs.numel() == 0:
        raise ValueError(f"log_probs must be a non-empty [B, T] tensor, got shape {tuple(log_probs.shape)}")
    if behavior_log_probs.shape != log_probs.shape or mask.shape != log_probs.shape:
        raise ValueError(
            f"log_probs {tuple(log_probs.shape)}, behavior_log_probs {tuple(behavior_log_probs.shape)} and "
            f"mask {tuple(mask.shape)} must have the same [B, T] shape")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True on policy tokens), got {mask.dtype}; use mask.bool()")
    if not (log_probs.is_floating_point() and behavior_log_probs.is_floating_point()):
        raise ValueError("log_probs and behavior_log_probs must be floating-point tensors")
    if len({log_probs.device, behavior_log_probs.device, mask.device}) != 1:
        raise ValueError("log_probs, behavior_log_probs and mask must be on one device")


def _per_trajectory(name: str, values: torch.Tensor, log_probs: torch.Tensor) -> torch.Tensor:
    """Check a [B] per-trajectory input and return it detached in the compute dtype."""
    if values.shape != (log_probs.shape[0],):
        raise ValueError(f"{name} must have shape [B]=({log_probs.shape[0]},), got {tuple(values.shape)}")
    if values.device != log_probs.device:
        raise ValueError(f"{name} are on {values.device} but log_probs on {log_probs.device}; move them together")
    values = values.detach().to(_compute_dtype(log_probs))
    if not torch.isfinite(values).all():
        raise ValueError(f"{name} must be finite; check the reward function for NaN/inf")
    return values


def _first_bad_row(bad: torch.Tensor) -> int:
    return int(bad.any(dim=-1).nonzero()[0, 0])


def _policy_values(name: str, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`values` with non-policy slots zeroed, after checking the policy slots are finite and <= 0.

    Zeroing first lets one min/max pass do the check (NaN fails both comparisons); the slow
    per-row search runs only to name the offending row.
    """
    safe = torch.where(mask, values, 0.0)
    low, high = torch.aminmax(safe)
    if not (high <= 0 and low > float("-inf")):
        bad = mask & ~((values <= 0) & (values > float("-inf")))
        raise ValueError(f"{name} must be finite and <= 0 on policy tokens; row {_first_bad_row(bad)} is not")
    return safe


def _objective(log_probs, behavior_log_probs, advantages, mask, config, *, failures, entropies,
               batch_size, batch_tokens) -> FlashReinforceOutput:
    dtype = advantages.dtype
    policy_tokens = mask.sum(dim=-1)
    if (policy_tokens == 0).any():
        raise ValueError(f"every trajectory needs at least one policy token; row "
                         f"{int((policy_tokens == 0).nonzero()[0, 0])} has none (drop it before the loss)")

    current = log_probs.to(dtype)
    # Non-policy slots are zeroed once so that NaN/inf padding never reaches exp() or log().
    current_safe = _policy_values("log_probs", current.detach(), mask)
    # Validated whether or not they are used, so a bad input never depends on the ablation.
    behavior = _policy_values("behavior_log_probs", behavior_log_probs.detach().to(dtype), mask)
    counts = policy_tokens.to(dtype)
    if not config.importance_sampling:
        # The no-IS ablation: the denominator is the current policy itself (every ratio 1), and
        # the paper drops the gate with it, so it is skipped rather than evaluated at KL 0.
        behavior = current_safe
        admitted = torch.ones_like(policy_tokens, dtype=torch.bool)
        active = mask
        sequence_kl = torch.zeros_like(counts)
        acceptance_rate = torch.ones((), dtype=dtype, device=counts.device)
    else:
        admitted, active, sequence_kl, acceptance_rate = _trust_region(behavior, current_safe, mask, counts, config)

    if config.uses_entropy_filter:
        active = active & _entropy_filter_keep(mask, failures, entropies, config.entropy_filter_q, policy_tokens)

    # Inactive tokens take exponent 0 so that rejected rows' extreme ratios never overflow.
    ratio = torch.exp(torch.where(active, current_safe - behavior, 0.0))
    if not torch.isfinite(ratio).all():
        raise ValueError(f"importance ratio pi/mu overflowed on an admitted token of row "
                         f"{_first_bad_row(~torch.isfinite(ratio))}; lower delta or check the stored log-probs")

    batch = log_probs.shape[0] if batch_size is None else batch_size
    if config.reduction == "sample_mean":
        row_denominator = counts * torch.as_tensor(batch, dtype=dtype, device=counts.device)
    elif config.reduction == "token_mean":
        total = counts.sum() if batch_tokens is None else torch.as_tensor(batch_tokens, dtype=dtype,
                                                                           device=counts.device)
        row_denominator = total.expand_as(counts)
    else:
        row_denominator = torch.full_like(counts, float(config.constant_length)) * batch
    token_weights = torch.where(active, ratio * advantages.unsqueeze(-1), 0.0)
    # NaN in masked slots of log_probs must not poison the sum (0 * NaN = NaN).
    loss = -((token_weights / row_denominator.unsqueeze(-1)) * torch.where(mask, current, 0.0)).sum()

    stats = FlashReinforceStats(
        advantages=advantages,
        sequence_kl=sequence_kl,
        admitted=admitted,
        acceptance_rate=acceptance_rate,
        policy_tokens=policy_tokens,
        retained_tokens=active.sum(dim=-1),
    )
    return FlashReinforceOutput(loss=loss, stats=stats, token_weights=token_weights)


def _trust_region(behavior, current, mask, counts, config):
    """(admitted [B], active [B, T], sequence_kl [B], acceptance_rate ()) of the KL gate."""
    token_kl = _bernoulli_kl(behavior, current).clamp_min(0.0)  # rounding can make an exact 0 negative
    if config.gate_mean == "geometric":
        # log(0) = -inf makes the row's mean log -inf and its geometric mean exactly 0.
        sequence_kl = (torch.where(mask, token_kl.log(), 0.0).sum(dim=-1) / counts).exp()
    else:
        sequence_kl = torch.where(mask, token_kl, 0.0).sum(dim=-1) / counts
    if config.gate_level == "sequence":
        admitted = sequence_kl <= config.delta
        active = mask & admitted.unsqueeze(-1)
        acceptance_rate = admitted.to(counts.dtype).mean()
    else:
        active = mask & (token_kl <= config.delta)
        admitted = (active == mask).all(dim=-1)
        acceptance_rate = active.sum().to(counts.dtype) / counts.sum()
    return admitted, active, sequence_kl, acceptance_rate


def _bernoulli_kl(behavior: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """KL(Bern(mu) || Bern(pi)) of the event "the sampled token", per position."""
    p = behavior.exp().clamp(PROBABILITY_CLAMP, 1 - PROBABILITY_CLAMP)
    q = current.exp().clamp(PROBABILITY_CLAMP, 1 - PROBABILITY_CLAMP)
    return p * (p.log() - q.log()) + (1 - p) * (torch.log1p(-p) - torch.log1p(-q))


def _entropy_filter_keep(mask, failures, entropies, q, policy_tokens) -> torch.Tensor:
    """[B, T] bool: all policy tokens of successful rows; the ceil(q*T_i) highest-entropy policy
    tokens of failed rows (ties go to the earlier position)."""
    if failures is None or entropies is None:
        raise ValueError(f"entropy_filter_q={q} < 1 needs explicit `failures` [B] and per-token `entropies` "
                         "[B, T]; pass both, or set entropy_filter_q=1.0")
    if failures.shape != policy_tokens.shape or failures.dtype != torch.bool:
        raise ValueError(f"failures must be a bool tensor of shape [B]={tuple(policy_tokens.shape)}, "
                         f"got {failures.dtype} {tuple(failures.shape)}")
    if entropies.shape != mask.shape or not entropies.is_floating_point():
        raise ValueError(f"entropies must be a float tensor of shape {tuple(mask.shape)}, "
                         f"got {entropies.dtype} {tuple(entropies.shape)}")
    if failures.device != mask.device or entropies.device != mask.device:
        raise ValueError("failures and entropies must be on the same device as log_probs")
    entropies = entropies.detach()
    # Every policy token is checked, successful rows' included, so a broken entropy computation
    # surfaces whatever the labels are; a NaN fails both comparisons of the min/max check.
    low, high = torch.aminmax(torch.where(mask, entropies, 0.0))
    if not (low > float("-inf") and high < float("inf")):
        raise ValueError(f"entropies must be finite on policy tokens; row "
                         f"{_first_bad_row(mask & ~torch.isfinite(entropies))} is not")
    failed_rows = failures.nonzero().squeeze(-1)
    if failed_rows.numel() == 0:
        return mask
    rows_mask, scores = mask[failed_rows], entropies[failed_rows]

    keep_count = torch.ceil(policy_tokens[failed_rows].to(torch.float64) * q - _CEIL_TOLERANCE).clamp_min(0).long()
    keep = mask.clone()
    keep[failed_rows] = _keep_highest(scores, rows_mask, keep_count, policy_tokens[failed_rows])
    return keep


def _keep_highest(scores: torch.Tensor, mask: torch.Tensor, keep_count: torch.Tensor,
                  policy_tokens: torch.Tensor) -> torch.Tensor:
    """[R, T] bool: per row, the keep_count highest-scoring policy positions, ties to the earlier.

    A partial selection (topk) of whichever side is smaller, the kept or the dropped tokens, finds
    each row's threshold score; a full sort of every row would cost several times more. Tokens
    past the threshold are decided by it; only when several tokens tie at a row's threshold are
    they taken in position order.
    """
    drop_count = policy_tokens - keep_count
    if int(keep_count.max()) <= int(drop_count.max()):
        count, largest, fill = keep_count, True, float("-inf")
    else:
        count, largest, fill = drop_count, False, float("inf")
    width = int(count.max())
    if width == 0:  # nothing to select on this side: keep everything, or nothing
        return mask if not largest else torch.zeros_like(mask)
    candidates = torch.where(mask, scores, fill)
    # Unsorted selection, then a sort of only the selected [R, width] values: cheaper than topk's own sort.
    selected = torch.topk(candidates, width, dim=-1, largest=largest, sorted=False).values
    selected = torch.sort(selected, dim=-1, descending=largest).values
    threshold = selected.gather(-1, (count - 1).clamp_min(0).unsqueeze(-1))
    active_rows = (count > 0).unsqueeze(-1)
    # Non-policy slots hold -inf/+inf, never on the selected side of a finite threshold.
    at_or_beyond = ((candidates >= threshold) if largest else (candidates <= threshold)) & active_rows
    if torch.equal(at_or_beyond.sum(dim=-1), count):  # no surplus tie at any threshold
        return at_or_beyond if largest else mask & ~at_or_beyond
    beyond = ((candidates > threshold) if largest else (candidates < threshold)) & mask
    tied = at_or_beyond & ~beyond
    # How many tied tokens join the selected side, counted from the earliest (largest) or the
    # latest (smallest) position, so that ties always favour keeping the earlier token.
    tied_selected = (count - beyond.sum(dim=-1)).unsqueeze(-1)
    if largest:
        return beyond | (tied & (tied.cumsum(dim=-1) <= tied_selected))
    tied_from_end = tied.sum(dim=-1, keepdim=True) - tied.cumsum(dim=-1) + tied.long()
    return mask & ~(beyond | (tied & (tied_from_end <= tied_selected)))
