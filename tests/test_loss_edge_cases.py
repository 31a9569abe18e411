"""Loss edge cases found by an independent audit (issue 11, item 5 a-e).

Each case is worked out by hand from the definitions in `objective`'s docstring; the Molt cases
run Molt 0.2.1's own `PolicyLoss` with our registered surrogate.
"""

from __future__ import annotations

import math

import pytest
import torch
from molt.models.loss import PolicyLoss

from molt_flashreinforce.objective import FlashReinforceConfig, flashreinforce_loss
from molt_flashreinforce.plugin import register
from molt_flashreinforce.plugin.policy_loss import FlashReinforcePolicyLoss

F64 = torch.float64
INF = float("inf")
RECIPE = dict(is_correction_level="seq", is_correction_gating="binary_kl", is_correction_mode="mask",
              loss_agg_mode="seq-mean-token-mean")


@pytest.fixture(scope="module", autouse=True)
def registered():
    register()


def bernoulli_kl(p: float, q: float) -> float:
    return p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))


# ── a. the registered surrogate inside Molt's stock PolicyLoss ──


@pytest.mark.parametrize("poison", [float("nan"), -INF])
def test_surrogate_loss_value_ignores_masked_slots(poison):
    log_probs = torch.tensor([[-0.5, -1.0, -0.7], [-0.2, -0.4, -0.3]], dtype=torch.float32)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    advantages = torch.tensor([[0.5], [-0.5]]) * mask
    loss_fn = PolicyLoss(loss_mode="flashreinforce", is_correction_threshold=[-INF, 3e-3], **RECIPE)

    clean = loss_fn(log_probs, log_probs, advantages, action_mask=mask, rollout_log_probs=log_probs)[0]
    poisoned_probs = log_probs.masked_fill(~mask, poison)
    poisoned = loss_fn(poisoned_probs, poisoned_probs, advantages, action_mask=mask,
                       rollout_log_probs=log_probs)[0]
    # By hand (ratio 1, every row admitted): -(1/2) [0.5 (-0.5 - 1.0)/2 - 0.5 (-0.2)/1] = 0.1375.
    assert clean.item() == pytest.approx(0.1375, rel=1e-6)
    assert poisoned.item() == pytest.approx(clean.item(), rel=1e-6)


# ── b. the geometric gate mean is the exact geometric mean ──


def test_geometric_gate_is_zero_when_one_token_kl_is_zero():
    """10 tokens at pi=0.5, mu=0.7, one of them with mu = pi: the geometric mean of the per-token
    KLs is exactly 0, so the row is admitted at any delta >= 0 (a floor made it 0.0067, rejected)."""
    mu = torch.full((1, 10), 0.7, dtype=F64)
    mu[0, 3] = 0.5
    current = torch.full((1, 10), math.log(0.5), dtype=F64).requires_grad_()
    out = flashreinforce_loss(current, mu.log(), torch.tensor([1.0], dtype=F64), torch.ones(1, 10, dtype=torch.bool),
                              FlashReinforceConfig(delta=3e-3, gate_mean="geometric"))
    assert out.stats.sequence_kl.item() == 0.0
    assert out.stats.admitted.tolist() == [True]


def test_geometric_gate_equals_the_exact_geometric_mean_without_zeros():
    kls = [bernoulli_kl(0.7, 0.5), bernoulli_kl(0.2, 0.25), bernoulli_kl(0.9, 0.6)]
    mu = torch.tensor([[0.7, 0.2, 0.9]], dtype=F64)
    pi = torch.tensor([[0.5, 0.25, 0.6]], dtype=F64)
    out = flashreinforce_loss(pi.log(), mu.log(), torch.tensor([1.0], dtype=F64), torch.ones(1, 3, dtype=torch.bool),
                              FlashReinforceConfig(delta=INF, gate_mean="geometric"))
    assert out.stats.sequence_kl.item() == pytest.approx((kls[0] * kls[1] * kls[2]) ** (1 / 3), rel=1e-12)


def test_geometric_gate_with_clamped_tokens_is_zero_not_a_floor_artifact():
    """Five tokens whose probabilities both clamp to 1 - 1e-6 (KL exactly 0) and five at KL 0.05:
    the geometric mean is 0 (the arithmetic mean is 0.025)."""
    pi = torch.tensor([[1.0] * 5 + [0.5] * 5], dtype=F64)
    mu = torch.tensor([[1.0] * 5 + [0.5] * 5], dtype=F64)
    q = 0.5 + math.sqrt(0.05 / 2)  # KL(Bern(0.5)||Bern(q)) ~ 0.05; the exact value does not matter
    pi[0, 5:] = q
    mask = torch.ones(1, 10, dtype=torch.bool)
    geometric = flashreinforce_loss(pi.log(), mu.log(), torch.tensor([1.0], dtype=F64), mask,
                                    FlashReinforceConfig(delta=INF, gate_mean="geometric"))
    arithmetic = flashreinforce_loss(pi.log(), mu.log(), torch.tensor([1.0], dtype=F64), mask,
                                     FlashReinforceConfig(delta=INF))
    assert geometric.stats.sequence_kl.item() == 0.0
    assert arithmetic.stats.sequence_kl.item() == pytest.approx(bernoulli_kl(0.5, q) / 2, rel=1e-9)


# ── c. no importance sampling skips the gate ──


@pytest.mark.parametrize("gate_level, gate_mean", [("sequence", "geometric"), ("sequence", "arithmetic"),
                                                   ("token", "arithmetic")])
def test_no_importance_sampling_admits_every_row_even_at_delta_zero(gate_level, gate_mean):
    current = torch.tensor([[-1.0, -0.5], [-0.2, -2.0]], dtype=F64).requires_grad_()
    behavior = torch.tensor([[-9.0, -9.0], [-0.2, -2.0]], dtype=F64)
    out = flashreinforce_loss(current, behavior, torch.tensor([1.0, 0.0], dtype=F64), torch.ones(2, 2, dtype=torch.bool),
                              FlashReinforceConfig(delta=0.0, gate_level=gate_level, gate_mean=gate_mean,
                                                   importance_sampling=False))
    out.loss.backward()
    assert out.stats.admitted.tolist() == [True, True]
    assert out.stats.acceptance_rate.item() == 1.0
    # Ratio 1, A = [0.5, -0.5], T_i = 2, B = 2.
    torch.testing.assert_close(current.grad, torch.tensor([[-0.125, -0.125], [0.125, 0.125]], dtype=F64))


# ── d. token-mean inside Molt has no sequence count ──


@pytest.mark.parametrize("reduction, constant_length", [("sample_mean", None), ("constant_length", 64)])
def test_molt_token_mean_aggregation_is_refused_when_the_reduction_needs_the_batch_size(reduction, constant_length):
    """Molt passes global_batch_size=None under --actor.loss_agg_mode token-mean (policy_actor.py),
    so the micro-batch would silently stand in for B."""
    config = FlashReinforceConfig(delta=3e-3, reduction=reduction, constant_length=constant_length)
    with pytest.raises(ValueError, match="loss_agg_mode token-mean"):
        FlashReinforcePolicyLoss(config, is_correction_level="seq", is_correction_gating="binary_kl",
                                 is_correction_mode="mask", is_correction_threshold=[-INF, 3e-3],
                                 loss_agg_mode="token-mean")


def test_molt_token_mean_aggregation_is_fine_for_the_token_mean_reduction():
    """token_mean divides by the window's token count, which Molt passes in every mode."""
    loss_fn = FlashReinforcePolicyLoss(FlashReinforceConfig(delta=INF, reduction="token_mean"),
                                       is_correction_level="seq", is_correction_gating="binary_kl",
                                       is_correction_mode="mask", is_correction_threshold=[-INF, INF],
                                       loss_agg_mode="token-mean")
    log_probs = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]], dtype=F64).requires_grad_()
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    advantages = torch.tensor([[0.5], [-0.5]], dtype=F64) * mask
    # This micro-batch is one of two halves of an 6-token window.
    loss, *_ = loss_fn(log_probs, log_probs.detach(), advantages, action_mask=mask, rollout_log_probs=log_probs.detach(),
                       batch_num_tokens=torch.tensor(6), global_batch_size=None)
    loss.backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-0.5 / 6, -0.5 / 6], [0.5 / 6, 0.0]], dtype=F64))


# ── e. entropies and behaviour log-probs are validated on every policy token ──


def test_nan_entropy_on_a_successful_rows_policy_token_is_rejected():
    current = torch.tensor([[-1.0, -0.5], [-0.2, -0.3]], dtype=F64)
    entropies = torch.tensor([[0.3, float("nan")], [0.1, 0.2]], dtype=F64)
    with pytest.raises(ValueError, match="entropies must be finite on policy tokens; row 0"):
        flashreinforce_loss(current, current, torch.tensor([1.0, 0.0], dtype=F64), torch.ones(2, 2, dtype=torch.bool),
                            FlashReinforceConfig(entropy_filter_q=0.5), failures=torch.tensor([False, True]),
                            entropies=entropies)


def test_nan_entropy_in_a_masked_slot_is_ignored():
    current = torch.tensor([[-1.0, -0.5], [-0.2, -0.3]], dtype=F64)
    entropies = torch.tensor([[0.3, float("nan")], [0.1, 0.2]], dtype=F64)
    mask = torch.tensor([[1, 0], [1, 1]], dtype=torch.bool)
    flashreinforce_loss(current, current, torch.tensor([1.0, 0.0], dtype=F64), mask,
                        FlashReinforceConfig(entropy_filter_q=0.5), failures=torch.tensor([False, True]),
                        entropies=entropies)


@pytest.mark.parametrize("bad", [float("nan"), 0.5, INF])
def test_behavior_log_probs_are_validated_without_importance_sampling(bad):
    current = torch.tensor([[-1.0, -0.5], [-0.2, -0.3]], dtype=F64)
    behavior = current.clone()
    behavior[1, 0] = bad
    with pytest.raises(ValueError, match="behavior_log_probs must be finite and <= 0 on policy tokens; row 1"):
        flashreinforce_loss(current, behavior, torch.tensor([1.0, 0.0], dtype=F64), torch.ones(2, 2, dtype=torch.bool),
                            FlashReinforceConfig(importance_sampling=False))
