"""The local backend's estimator + loss go through Molt's registry and PolicyLoss when Molt is
installed, and give the same FlashREINFORCE objective as the pure-torch fallback."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from molt_flashreinforce.local.objective import MoltObjective, ObjectiveError, TorchFlashReinforce, build_objective
from molt_flashreinforce.local.sampler import Rollouts

pytest.importorskip("molt")

FLASH = OmegaConf.create({"name": "flashreinforce", "group_size": 1, "delta": 3e-3})
GRPO = OmegaConf.create({"name": "grpo", "group_size": 2, "clip_eps": 0.2})
MASK = torch.tensor([[True, True, False], [True, True, True], [True, False, False], [True, True, False]])
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0])


def _rollouts(behavior_log_probs):
    return Rollouts(prompt_ids=torch.zeros(4, 1, dtype=torch.long), response_ids=torch.zeros(4, 3, dtype=torch.long),
                    mask=MASK, log_probs=behavior_log_probs, truncated=torch.zeros(4, dtype=torch.bool),
                    behavior_version=0)


def test_flashreinforce_advantage_is_reward_minus_batch_mean():
    objective = build_objective(FLASH)
    assert isinstance(objective, MoltObjective)
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5])[:, None] * MASK
    assert torch.allclose(objective.advantages(REWARDS, MASK), expected)


def test_grpo_advantage_is_group_normalised_by_molt():
    objective = build_objective(GRPO)
    rewards = torch.tensor([1.0, 0.0, 3.0, 3.0])
    # group (1, 0): mean 0.5, sample std sqrt(0.5); group (3, 3): all zero
    expected = torch.tensor([0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5), 0.0, 0.0])[:, None] * MASK
    assert torch.allclose(objective.advantages(rewards, MASK), expected, atol=1e-6)


def test_molt_path_matches_the_torch_objective_value_gradient_and_gate():
    torch.manual_seed(0)
    behavior = -torch.rand(4, 3) - 0.1
    current_values = behavior.clone()
    current_values[2] -= 1.0  # row 2 drifted far from its behaviour policy: the gate must drop it
    results = []
    for objective in (build_objective(FLASH), TorchFlashReinforce(FLASH)):
        current = current_values.clone().requires_grad_(True)
        advantages = objective.advantages(REWARDS, MASK)
        loss, stats = objective.loss(current, _rollouts(behavior), advantages, REWARDS)
        loss.backward()
        results.append((loss.detach(), current.grad, stats))
    (molt_loss, molt_grad, molt_stats), (torch_loss, torch_grad, torch_stats) = results
    assert torch.allclose(molt_loss, torch_loss, atol=1e-6)
    assert torch.allclose(molt_grad, torch_grad, atol=1e-6)
    assert molt_stats.accepted.tolist() == [True, True, False, True] == torch_stats.accepted.tolist()
    assert molt_stats.acceptance_rate == pytest.approx(0.75) == torch_stats.acceptance_rate
    # By hand: d loss / d l_{i,t} = -A_i * rho_{i,t} / (B * T_i) on admitted rows, rho = 1 here.
    expected = torch.zeros(4, 3)
    for row, (a, t) in enumerate([(0.5, 2), (-0.5, 3), (None, 1), (0.5, 2)]):
        if a is not None:
            expected[row, :t] = -a / (4 * t)
    assert torch.allclose(molt_grad, expected, atol=1e-6)


def test_grpo_loss_is_molts_token_mean_ppo_surrogate():
    objective = build_objective(GRPO)
    current = (-torch.rand(4, 3)).requires_grad_(True)
    advantages = objective.advantages(REWARDS, MASK)
    loss, stats = objective.loss(current, _rollouts(current.detach() - 2.0), advantages, REWARDS)
    loss.backward()
    # ratio 1 (old = current, one pass): gradient -A / (number of policy tokens), no behaviour correction
    assert torch.allclose(current.grad, -advantages / MASK.sum())
    assert stats.acceptance_rate is None


def test_bad_algorithms_get_clear_errors():
    with pytest.raises(ObjectiveError, match="group_size must be 1"):
        build_objective(OmegaConf.create({"name": "flashreinforce", "group_size": 4}))
    with pytest.raises(ObjectiveError, match="group_size >= 2"):
        build_objective(OmegaConf.create({"name": "grpo", "group_size": 1}))
    with pytest.raises(ObjectiveError, match="not supported"):
        build_objective(OmegaConf.create({"name": "ppo"}))
    with pytest.raises(ObjectiveError, match="Molt is not importable"):
        build_objective(GRPO, use_molt=False)
    assert isinstance(build_objective(FLASH, use_molt=False), TorchFlashReinforce)
