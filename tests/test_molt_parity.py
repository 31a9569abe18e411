"""Our objective against Molt 0.2.1's own `PolicyLoss` and `flash_reinforce` estimator.

Molt's `PolicyLoss` in the FlashREINFORCE recipe configuration (old = current.detach(), IS level
seq, gating binary_kl, mode mask, threshold [-inf, delta], seq-mean-token-mean) is the published
way to run the method on Molt. Its gradient must equal ours; where Molt can express an ablation
(token gate, token-mean, constant length) that must match too. Molt computes in float32, so
the float64 inputs are compared to a relative 1e-6.
"""

from __future__ import annotations

import pytest
import torch
from molt.models.loss import POLICY_LOSSES, PolicyLoss
from molt.trainer.algorithm.advantage import ADVANTAGE_ESTIMATORS, AdvantageContext

from molt_flashreinforce.objective import FlashReinforceConfig, flashreinforce_loss
from molt_flashreinforce.plugin import build_policy_loss, register
from molt_flashreinforce.plugin.policy_loss import FlashReinforcePolicyLoss, flashreinforce_surrogate

INF = float("inf")


@pytest.fixture(scope="module", autouse=True)
def registered():
    register()


def random_batch(seed, batch=16, width=40):
    """Unequal lengths, a few strongly drifted rows (rejected at small delta) and mild drift elsewhere."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (batch,), generator=generator)
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    current = -torch.rand(batch, width, generator=generator, dtype=torch.float64) * 2.5
    drift = torch.rand(batch, width, generator=generator, dtype=torch.float64) * 0.02
    drift[:3] += 1.5  # rows 0-2 drifted far: rejected by any small trust region
    behavior = current - drift
    rewards = torch.randint(0, 2, (batch,), generator=generator).to(torch.float64)
    rewards[0], rewards[1] = 1.0, 0.0  # never a constant-reward batch
    return current, behavior, rewards, mask


def molt_gradient(current, behavior, rewards, mask, **policy_loss_kwargs):
    log_probs = current.clone().requires_grad_()
    advantages = (rewards - rewards.mean()).unsqueeze(-1) * mask
    loss_fn = PolicyLoss(**policy_loss_kwargs)
    loss, _, _, _, _, is_filter_ratio = loss_fn(log_probs, log_probs.detach(), advantages, action_mask=mask,
                                                 rollout_log_probs=behavior)
    loss.backward()
    return log_probs.grad.double(), is_filter_ratio


def our_gradient(current, behavior, rewards, mask, config):
    log_probs = current.clone().requires_grad_()
    out = flashreinforce_loss(log_probs, behavior, rewards, mask, config)
    out.loss.backward()
    return log_probs.grad, out.stats


def assert_gradients_match(ours, molts):
    scale = molts.abs().max()
    assert scale > 0
    torch.testing.assert_close(ours, molts, rtol=1e-6, atol=1e-6 * scale.item())


RECIPE = dict(is_correction_level="seq", is_correction_gating="binary_kl", is_correction_mode="mask",
              loss_agg_mode="seq-mean-token-mean")


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("delta", [3e-3, 5e-3, INF])
def test_gradient_and_acceptance_match_molt_recipe(seed, delta):
    batch = random_batch(seed)
    molts, is_filter_ratio = molt_gradient(*batch, is_correction_threshold=[-INF, delta], **RECIPE)
    ours, stats = our_gradient(*batch, FlashReinforceConfig(delta=delta))
    assert_gradients_match(ours, molts)
    assert stats.acceptance_rate.item() == pytest.approx(1 - is_filter_ratio.mean().item(), abs=1e-12)
    if delta != INF:
        assert not stats.admitted[:3].any() and stats.admitted[3:].any()


@pytest.mark.parametrize("seed", [0, 1])
def test_token_gate_matches_molt_token_level(seed):
    batch = random_batch(seed)
    molts, _ = molt_gradient(*batch, is_correction_threshold=[-INF, 3e-3],
                             **{**RECIPE, "is_correction_level": "token"})
    ours, _ = our_gradient(*batch, FlashReinforceConfig(delta=3e-3, gate_level="token"))
    assert_gradients_match(ours, molts)


@pytest.mark.parametrize("seed", [0, 1])
def test_token_mean_matches_molt_token_mean(seed):
    batch = random_batch(seed)
    molts, _ = molt_gradient(*batch, is_correction_threshold=[-INF, 3e-3],
                             **{**RECIPE, "loss_agg_mode": "token-mean"})
    ours, _ = our_gradient(*batch, FlashReinforceConfig(delta=3e-3, reduction="token_mean"))
    assert_gradients_match(ours, molts)


def test_constant_length_matches_molt_seq_mean_token_sum_norm():
    # Molt's PolicyLoss does not pass loss_scale_factor to agg_loss, so its constant is the padded width.
    current, behavior, rewards, mask = random_batch(3)
    molts, _ = molt_gradient(current, behavior, rewards, mask, is_correction_threshold=[-INF, 3e-3],
                             **{**RECIPE, "loss_agg_mode": "seq-mean-token-sum-norm"})
    ours, _ = our_gradient(current, behavior, rewards, mask,
                           FlashReinforceConfig(delta=3e-3, reduction="constant_length",
                                                constant_length=mask.shape[1]))
    assert_gradients_match(ours, molts)


def test_estimator_matches_molts_flash_reinforce_through_advantage_context():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    masks = [torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool),
             torch.tensor([[1, 1, 1], [0, 1, 1], [1, 0, 0]], dtype=torch.bool)]
    ctx = AdvantageContext(sample_to_rollout=torch.arange(5), exp_len=[2, 3], action_masks=masks, kl_coef=0.0,
                           gamma=1.0, lam=1.0, kls=[torch.zeros(2, 3), torch.zeros(3, 3)], no_whiten=False)
    groups = [[i] for i in range(5)]
    ours = ADVANTAGE_ESTIMATORS["flashreinforce"](rewards, groups, ctx)
    molts = ADVANTAGE_ESTIMATORS["flash_reinforce"](rewards, groups, ctx)
    for our_list, molt_list in zip(ours, molts):
        for our_tensor, molt_tensor in zip(our_list, molt_list):
            torch.testing.assert_close(our_tensor, molt_tensor, rtol=0, atol=0)
    # And by hand: mean reward 0.6, so row 0 of experience 0 has advantage 0.4 on its two tokens.
    torch.testing.assert_close(ours[0][0], torch.tensor([[0.4, 0.4, 0.0], [-0.6, 0.0, 0.0]]))


def test_molt_policy_loss_runs_our_registered_surrogate_end_to_end():
    assert POLICY_LOSSES["flashreinforce"] is flashreinforce_surrogate
    batch = random_batch(4)
    molts, is_filter_ratio = molt_gradient(*batch, is_correction_threshold=[-INF, 3e-3], loss_mode="flashreinforce",
                                           **RECIPE)
    ours, stats = our_gradient(*batch, FlashReinforceConfig(delta=3e-3))
    assert_gradients_match(ours, molts)
    assert stats.acceptance_rate.item() == pytest.approx(1 - is_filter_ratio.mean().item())


def test_registration_is_idempotent():
    import molt_flashreinforce

    register()
    molt_flashreinforce.register()
    assert ADVANTAGE_ESTIMATORS["flashreinforce"].__module__ == "molt_flashreinforce.plugin.estimator"


@pytest.mark.parametrize("config", [
    FlashReinforceConfig(delta=3e-3),
    FlashReinforceConfig(delta=3e-3, gate_level="token"),
    FlashReinforceConfig(delta=3e-3, gate_mean="geometric", reduction="token_mean"),
    FlashReinforceConfig(delta=3e-3, importance_sampling=False, reduction="constant_length", constant_length=50),
    FlashReinforceConfig(delta=3e-3, entropy_filter_q=0.3),
])
def test_subclass_in_molts_call_convention_equals_the_objective(config):
    """Molt calls the loss per micro-batch with the window's counts and dp_size; the pieces must add
    up to our whole-batch objective (dp_size divides out again under FSDP's gradient averaging)."""
    current, behavior, rewards, mask = random_batch(5)
    failures = rewards == 0
    entropies = torch.rand(current.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    expected_full = current.clone().requires_grad_()
    flashreinforce_loss(expected_full, behavior, rewards, mask, config, failures=failures,
                        entropies=entropies).loss.backward()

    algo = {"name": "flashreinforce", **vars(config)}
    loss_fn = build_policy_loss(algo)
    assert isinstance(loss_fn, FlashReinforcePolicyLoss)
    log_probs = current.clone().requires_grad_()
    advantages = (rewards - rewards.mean()).unsqueeze(-1) * mask
    dp_size = 2
    for rows in (slice(0, 5), slice(5, 16)):
        loss, *_ = loss_fn(log_probs[rows], log_probs[rows].detach(), advantages[rows], action_mask=mask[rows],
                           rollout_log_probs=behavior[rows], dp_size=dp_size, global_batch_size=16,
                           batch_num_tokens=mask.sum(), failures=failures[rows], entropies=entropies[rows])
        (loss / dp_size).backward()
    torch.testing.assert_close(log_probs.grad, expected_full.grad, rtol=1e-12, atol=1e-15)


def test_subclass_rejects_a_second_trust_region():
    register()
    with pytest.raises(ValueError, match="configured twice"):
        FlashReinforcePolicyLoss(FlashReinforceConfig(delta=3e-3), is_correction_level="seq",
                                 is_correction_gating="binary_kl", is_correction_threshold=[-INF, 5e-3])
    with pytest.raises(ValueError, match="is_correction_level"):
        FlashReinforcePolicyLoss(FlashReinforceConfig(delta=3e-3), is_correction_level="off")


def test_grpo_baseline_is_molts_ppo_token_mean():
    loss_fn = build_policy_loss({"name": "grpo", "group_size": 4, "clip_eps": 0.2, "reduction": "token_mean"})
    assert type(loss_fn) is PolicyLoss
    assert (loss_fn.loss_mode, loss_fn.loss_agg_mode, loss_fn.is_correction_level) == ("ppo", "token-mean", "off")
