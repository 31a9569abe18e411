"""The trust region's float32 trap (OpenRLHF PR #1354): for nearly identical policies the Bernoulli
KL p log(p/q) + (1-p) log((1-p)/(1-q)) cancels, and float32 rounding leaves small negative values,
so a gate with a lower bound of 0 rejects valid samples. float32 against float64, for the package's
loss, for our loss as Molt's actors run it, and for the registered surrogate inside Molt's own
`PolicyLoss` with Molt's threshold given as `δ` and as `0 δ`."""

from __future__ import annotations

import pytest
import torch
from molt.models.loss import PolicyLoss

from molt_flashreinforce.launch.molt_cli import parse_and_validate
from molt_flashreinforce.objective import FlashReinforceConfig, _bernoulli_kl, flashreinforce_loss
from molt_flashreinforce.plugin import register
from molt_flashreinforce.plugin.policy_loss import FlashReinforcePolicyLoss, policy_loss_from_args

DELTA = 3e-3
ROWS, TOKENS = 32, 64


def near_identical(scale, seed=0):
    """(current, behaviour) log-probs in float64 whose probabilities differ by about `scale`."""
    generator = torch.Generator().manual_seed(seed)
    current = -torch.rand(ROWS, TOKENS, generator=generator, dtype=torch.float64) * 3
    return current, current + torch.randn(ROWS, TOKENS, generator=generator, dtype=torch.float64) * scale


def test_float32_cancellation_makes_the_bernoulli_kl_negative():
    """The trap is real at these inputs, so the tests below can fail."""
    current, behaviour = near_identical(1e-6)
    assert (_bernoulli_kl(behaviour.float(), current.float()) < 0).float().mean() > 0.2
    assert _bernoulli_kl(behaviour, current).min() > -1e-15  # float64 rounds far below any delta


@pytest.mark.parametrize("scale", [0.0, 1e-7, 1e-6, 1e-5])
@pytest.mark.parametrize("gate", [("sequence", "arithmetic"), ("sequence", "geometric"), ("token", "arithmetic")])
def test_package_loss_admits_near_identical_policies_in_float32_as_in_float64(scale, gate):
    current, behaviour = near_identical(scale)
    rewards = torch.arange(ROWS, dtype=torch.float64) % 2
    mask = torch.ones(ROWS, TOKENS, dtype=torch.bool)
    config = FlashReinforceConfig(delta=DELTA, gate_level=gate[0], gate_mean=gate[1])
    results = {}
    for dtype in (torch.float32, torch.float64):
        log_probs = current.to(dtype).requires_grad_()
        out = flashreinforce_loss(log_probs, behaviour.to(dtype), rewards.to(dtype), mask, config)
        out.loss.backward()
        results[dtype] = out, log_probs.grad
    (ours, grad32), (exact, grad64) = results[torch.float32], results[torch.float64]
    assert ours.stats.admitted.all() and exact.stats.admitted.all()
    assert ours.stats.acceptance_rate.item() == 1.0
    assert (ours.stats.sequence_kl >= 0).all()
    torch.testing.assert_close(ours.loss.double(), exact.loss, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(grad32.double(), grad64, rtol=1e-5, atol=1e-9)


def molt_loss_inputs(scale):
    current, behaviour = near_identical(scale)
    advantages = ((torch.arange(ROWS) % 2).float() - 0.5).unsqueeze(-1).expand(ROWS, TOKENS).contiguous()
    return current.float(), behaviour.float(), advantages, torch.ones(ROWS, TOKENS, dtype=torch.bool)


def run_molt_loss(loss_fn, scale):
    current, behaviour, advantages, mask = molt_loss_inputs(scale)
    log_probs = current.clone().requires_grad_()
    loss, _, _, _, _, filtered = loss_fn(log_probs, current, advantages, action_mask=mask, rollout_log_probs=behaviour,
                                         global_batch_size=torch.tensor(ROWS), batch_num_tokens=mask.sum())
    loss.backward()
    return loss.detach(), log_probs.grad, filtered


def molt_kwargs(threshold):
    return dict(is_correction_level="seq", is_correction_gating="binary_kl", is_correction_mode="mask",
                is_correction_threshold=threshold, loss_agg_mode="seq-mean-token-mean")


@pytest.mark.parametrize("threshold", [[0.0, DELTA], [-float("inf"), DELTA]], ids=["0 delta", "delta"])
@pytest.mark.parametrize("scale", [1e-7, 1e-6, 1e-5])
def test_our_loss_in_molts_actors_admits_near_identical_policies_with_either_threshold(threshold, scale):
    """What a Molt actor runs for --actor.loss_mode flashreinforce: its gate is the package's, clamped."""
    register()
    loss, grad, filtered = run_molt_loss(FlashReinforcePolicyLoss(FlashReinforceConfig(delta=DELTA),
                                                                  **molt_kwargs(threshold)), scale)
    assert (filtered == 0).all()
    current, behaviour, advantages, mask = molt_loss_inputs(scale)
    log_probs = current.double().requires_grad_()
    exact = flashreinforce_loss(log_probs, behaviour.double(), (advantages[:, 0] + 0.5).double(), mask,
                                FlashReinforceConfig(delta=DELTA))
    exact.loss.backward()
    torch.testing.assert_close(grad.double(), log_probs.grad, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("scale", [1e-7, 1e-6, 1e-5])
def test_registered_surrogate_in_molts_policy_loss(scale):
    """Molt's own gate computes the KL in float32 (it upcasts float64 too). With `δ` (read as
    [-inf, δ], what the launcher renders) it admits every near-identical row, like float64 math;
    with `0 δ` Molt's gate rejects valid rows: the trap bites there, inside Molt's code."""
    register()
    admitted = run_molt_loss(PolicyLoss(loss_mode="flashreinforce", **molt_kwargs([-float("inf"), DELTA])), scale)
    assert (admitted[2] == 0).all()
    rejected = run_molt_loss(PolicyLoss(loss_mode="flashreinforce", **molt_kwargs([0.0, DELTA])), scale)
    assert rejected[2].mean() > 0.2


def test_molt_cli_threshold_0_delta_reaches_the_clamped_gate(tmp_path):
    """`--algo.advantage.is_correction_threshold 0 δ` on Molt's command line: the actors' loss for
    loss_mode flashreinforce is ours (its clamped gate), not Molt's gate with the bound 0."""
    register()
    agent = tmp_path / "agent.py"
    agent.write_text("")
    args = parse_and_validate([
        "--actor.model_name_or_path", "tiny", "--train.agent_path", str(agent),
        "--algo.advantage.estimator", "flashreinforce", "--actor.loss_mode", "flashreinforce",
        "--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_gating", "binary_kl",
        "--algo.advantage.is_correction_threshold", "0", str(DELTA), "--actor.loss_agg_mode", "seq-mean-token-mean",
        "--train.force_on_policy", "--rollout.n_samples_per_prompt", "1", "--flashreinforce.delta", str(DELTA),
        "--vllm.num_engines", "1"])
    assert args.algo.advantage.is_correction_threshold == [0.0, DELTA]
    loss_fn = policy_loss_from_args(args)
    assert isinstance(loss_fn, FlashReinforcePolicyLoss)
    assert (run_molt_loss(loss_fn, 1e-6)[2] == 0).all()
