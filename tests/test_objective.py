"""The pure-torch objective against values derived by hand from the paper's definition.

Every expected number below is worked out from the formulas in `objective`'s docstring
(A_i = R_i - mean R; gradient of L w.r.t. log pi_it = -m_i * rho_it * A_i / denominator),
not captured from the code. `test_matches_literal_transcription` adds a row-by-row,
loop-based transcription of the definition as an independent reference on random batches.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from molt_flashreinforce.objective import (
    FlashReinforceConfig,
    flashreinforce_loss,
    flashreinforce_policy_loss,
)

F64 = torch.float64
INF = float("inf")


def leaf(values, dtype=F64):
    return torch.tensor(values, dtype=dtype).requires_grad_()


def bool_mask(rows):
    return torch.tensor(rows, dtype=torch.bool)


def test_gradient_is_ratio_times_advantage_over_own_length_and_batch():
    current = leaf([[-1.0, -2.0, -0.5], [-0.3, -0.2, -0.9]])
    behavior = (current.detach() - 0.1).requires_grad_()
    rewards = torch.tensor([1.0, 0.0], dtype=F64, requires_grad=True)
    mask = bool_mask([[1, 1, 1], [1, 1, 0]])

    out = flashreinforce_loss(current, behavior, rewards, mask, FlashReinforceConfig(delta=INF))
    out.loss.backward()

    # A = [0.5, -0.5]; rho = e^0.1 on every token; T = [3, 2]; B = 2.
    rho = math.exp(0.1)
    expected = torch.tensor([[-0.5 * rho / 3 / 2] * 3, [0.5 * rho / 2 / 2] * 2 + [0.0]], dtype=F64)
    torch.testing.assert_close(current.grad, expected, rtol=1e-12, atol=0)
    assert behavior.grad is None and rewards.grad is None
    for value in vars(out.stats).values():
        assert not value.requires_grad
    torch.testing.assert_close(out.stats.advantages, torch.tensor([0.5, -0.5], dtype=F64))
    assert out.stats.policy_tokens.tolist() == [3, 2] and out.stats.retained_tokens.tolist() == [3, 2]


def test_sequence_gate_drops_whole_row_and_keeps_batch_denominator():
    current = leaf([[-1.0, -0.7], [-0.5, -0.6]])
    behavior = torch.tensor([[-4.0, -0.7], [-0.5, -0.6]], dtype=F64)  # row 0 drifted on one token
    mask = bool_mask([[1, 1], [1, 1]])
    out = flashreinforce_loss(current, behavior, torch.tensor([0.0, 1.0], dtype=F64), mask)
    out.loss.backward()

    assert out.stats.admitted.tolist() == [False, True]
    assert out.stats.acceptance_rate.item() == 0.5
    # Row 1 has ratio 1, A = 0.5, T = 2 and B stays 2 although row 0 was rejected.
    torch.testing.assert_close(current.grad, torch.tensor([[0.0, 0.0], [-0.125, -0.125]], dtype=F64))
    assert out.stats.retained_tokens.tolist() == [0, 2]


@pytest.mark.parametrize("poison", [float("nan"), INF, -INF])
def test_values_in_masked_slots_are_ignored(poison):
    mask = bool_mask([[1, 1, 0], [1, 0, 0]])
    current = leaf([[-1.0, -0.5, poison], [-0.2, poison, poison]])
    behavior = torch.tensor([[-1.0, -0.5, poison], [-0.2, poison, -poison]], dtype=F64)
    out = flashreinforce_loss(current, behavior, torch.tensor([1.0, 0.0], dtype=F64), mask,
                              FlashReinforceConfig(delta=INF))
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(current.grad).all()
    assert current.grad[~mask].abs().sum() == 0
    torch.testing.assert_close(current.grad[mask], torch.tensor([-0.125, -0.125, 0.25], dtype=F64))


@pytest.mark.parametrize("q, kept", [(0.0, 0), (0.2, 1), (0.9, 3), (1.0, 3)])
def test_entropy_filter_keeps_ceil_q_t_highest_entropy_tokens_of_failed_rows(q, kept):
    mask = bool_mask([[1, 1, 1, 0], [1, 1, 1, 0]])
    current = leaf([[-1.0, -1.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0]])
    # The masked slot's entropy 99 must never be picked.
    entropies = torch.tensor([[0.5, 2.0, 1.0, 99.0], [0.1, 0.2, 0.3, 99.0]], dtype=F64)
    out = flashreinforce_loss(current, current.detach(), torch.tensor([0.0, 1.0], dtype=F64), mask,
                              FlashReinforceConfig(delta=INF, entropy_filter_q=q),
                              failures=torch.tensor([True, False]), entropies=entropies)
    out.loss.backward()
    assert out.stats.retained_tokens.tolist() == [kept, 3]
    by_entropy = [1, 2, 0]  # positions of row 0 from highest to lowest entropy
    expected_row0 = torch.zeros(4, dtype=F64)
    expected_row0[by_entropy[:kept]] = 1 / 12  # -A/(T B) = 0.5/(3*2); T stays 3
    torch.testing.assert_close(current.grad[0], expected_row0)
    torch.testing.assert_close(current.grad[1], torch.tensor([-1 / 12] * 3 + [0.0], dtype=F64))


def test_entropy_filter_count_is_exact_where_floating_point_is_not():
    # 0.9 * 10 = 9.000000000000002 in binary floating point: the filter must keep 9, not 10.
    mask = torch.ones(1, 10, dtype=torch.bool)
    current = leaf([[-1.0] * 10])
    out = flashreinforce_loss(current, current.detach(), torch.tensor([0.0], dtype=F64), mask,
                              FlashReinforceConfig(entropy_filter_q=0.9), failures=torch.tensor([True]),
                              entropies=torch.arange(10, dtype=F64).unsqueeze(0))
    assert out.stats.retained_tokens.tolist() == [9]


def test_entropy_filter_ties_go_to_the_earlier_position():
    current = leaf([[-1.0] * 4, [-1.0] * 4])
    out = flashreinforce_loss(current, current.detach(), torch.tensor([0.0, 1.0], dtype=F64),
                              torch.ones(2, 4, dtype=torch.bool),
                              FlashReinforceConfig(delta=INF, entropy_filter_q=0.5),
                              failures=torch.tensor([True, False]),
                              entropies=torch.tensor([[1.0, 3.0, 3.0, 3.0], [0.0] * 4], dtype=F64))
    out.loss.backward()
    assert (current.grad[0] != 0).tolist() == [False, True, True, False]


def test_filter_follows_explicit_failures_not_advantage_sign():
    mask = torch.ones(2, 2, dtype=torch.bool)
    current = leaf([[-1.0, -1.0], [-1.0, -1.0]])
    out = flashreinforce_loss(current, current.detach(), torch.tensor([1.0, 2.0], dtype=F64), mask,
                              FlashReinforceConfig(entropy_filter_q=0.0),
                              failures=torch.tensor([False, True]), entropies=torch.ones(2, 2, dtype=F64))
    # Row 0 has A = -0.5 but is not a failure: it keeps both tokens. Row 1 is a failure with
    # A = +0.5: at q = 0 it keeps none.
    assert out.stats.retained_tokens.tolist() == [2, 0]


@pytest.mark.parametrize("case", ["constant_rewards", "all_rejected"])
def test_zero_loss_and_gradient(case):
    current = leaf([[-1.0, -0.5], [-0.2, -0.3]])
    behavior = current.detach() - (5.0 if case == "all_rejected" else 0.0)
    rewards = torch.tensor([1.0, 1.0] if case == "constant_rewards" else [1.0, 0.0], dtype=F64)
    out = flashreinforce_loss(current, behavior, rewards, torch.ones(2, 2, dtype=torch.bool))
    out.loss.backward()
    assert out.loss.item() == 0.0 and current.grad.abs().sum().item() == 0.0


def test_binary_kl_direction_and_inclusive_boundary():
    mu, pi = 0.2, 0.4
    current = leaf([[math.log(pi)]])
    behavior = torch.tensor([[math.log(mu)]], dtype=F64)
    mask = torch.ones(1, 1, dtype=torch.bool)
    out = flashreinforce_loss(current, behavior, torch.tensor([1.0], dtype=F64), mask,
                              FlashReinforceConfig(delta=INF))
    kl_mu_to_pi = mu * math.log(mu / pi) + (1 - mu) * math.log((1 - mu) / (1 - pi))
    kl_pi_to_mu = pi * math.log(pi / mu) + (1 - pi) * math.log((1 - pi) / (1 - mu))
    assert out.stats.sequence_kl.item() == pytest.approx(kl_mu_to_pi, rel=1e-12)
    assert abs(kl_mu_to_pi - kl_pi_to_mu) > 1e-3  # the direction is observable
    at_delta = out.stats.sequence_kl.item()
    admitted = flashreinforce_loss(current, behavior, torch.tensor([1.0], dtype=F64), mask,
                                   FlashReinforceConfig(delta=at_delta)).stats.admitted
    rejected = flashreinforce_loss(current, behavior, torch.tensor([1.0], dtype=F64), mask,
                                   FlashReinforceConfig(delta=math.nextafter(at_delta, 0))).stats.admitted
    assert admitted.tolist() == [True] and rejected.tolist() == [False]


def test_token_gate_drops_single_tokens_and_keeps_row_length():
    current = leaf([[-1.0, -1.0, -1.0]])
    behavior = torch.tensor([[-1.0, -4.0, -1.0]], dtype=F64)  # only the middle token drifted
    rewards = torch.tensor([1.0, 0.0], dtype=F64)
    current2 = torch.cat([current, current.detach()])
    out = flashreinforce_loss(current2, torch.cat([behavior, behavior]), rewards,
                              torch.ones(2, 3, dtype=torch.bool), FlashReinforceConfig(gate_level="token"))
    out.loss.backward()
    # Kept tokens: ratio 1, A = 0.5, T = 3, B = 2 -> -1/12; the drifted token gets nothing.
    torch.testing.assert_close(current.grad, torch.tensor([[-1 / 12, 0.0, -1 / 12]], dtype=F64))
    assert out.stats.acceptance_rate.item() == pytest.approx(4 / 6)
    assert out.stats.admitted.tolist() == [False, False]


def test_geometric_gate_mean_is_exp_of_mean_log_kl():
    mu = torch.tensor([[0.2, 0.5, 0.9]], dtype=F64)
    pi = torch.tensor([[0.25, 0.5, 0.6]], dtype=F64)
    current = leaf(pi.log().tolist())
    per_token = mu * (mu / pi).log() + (1 - mu) * ((1 - mu) / (1 - pi)).log()
    assert per_token[0, 1].item() == 0.0  # the middle token's probabilities agree
    out = flashreinforce_loss(current, mu.log(), torch.tensor([1.0], dtype=F64), torch.ones(1, 3, dtype=torch.bool),
                              FlashReinforceConfig(delta=0.0, gate_mean="geometric"))
    # The exact geometric mean of (d_0, 0, d_2) is 0: the row passes even delta = 0.
    assert out.stats.sequence_kl.item() == 0.0 and out.stats.admitted.tolist() == [True]
    edges = flashreinforce_loss(current[:, ::2], mu.log()[:, ::2], torch.tensor([1.0], dtype=F64),
                                torch.ones(1, 2, dtype=torch.bool), FlashReinforceConfig(delta=INF, gate_mean="geometric"))
    assert edges.stats.sequence_kl.item() == pytest.approx(math.sqrt(per_token[0, 0] * per_token[0, 2]), rel=1e-12)
    arithmetic = flashreinforce_loss(current, mu.log(), torch.tensor([1.0], dtype=F64),
                                     torch.ones(1, 3, dtype=torch.bool), FlashReinforceConfig(delta=INF))
    assert arithmetic.stats.sequence_kl.item() == pytest.approx(per_token.mean().item(), rel=1e-12)


@pytest.mark.parametrize("reduction, denominators", [
    ("sample_mean", [3 * 2, 1 * 2]),
    ("token_mean", [4, 4]),
    ("constant_length", [2 * 10, 2 * 10]),
])
def test_reductions(reduction, denominators):
    current = leaf([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    mask = bool_mask([[1, 1, 1], [1, 0, 0]])
    config = FlashReinforceConfig(reduction=reduction, constant_length=10 if reduction == "constant_length" else None)
    out = flashreinforce_loss(current, current.detach(), torch.tensor([1.0, 0.0], dtype=F64), mask, config)
    out.loss.backward()
    expected = torch.tensor([[-0.5 / denominators[0]] * 3, [0.5 / denominators[1], 0, 0]], dtype=F64)
    torch.testing.assert_close(current.grad, expected)


def test_without_importance_sampling_ratio_is_one_and_nothing_is_gated():
    current = leaf([[-1.0, -1.0], [-1.0, -1.0]])
    behavior = torch.tensor([[-9.0, -9.0], [-1.0, -1.0]], dtype=F64)  # would be rejected with IS
    out = flashreinforce_loss(current, behavior, torch.tensor([1.0, 0.0], dtype=F64),
                              torch.ones(2, 2, dtype=torch.bool), FlashReinforceConfig(importance_sampling=False))
    out.loss.backward()
    assert out.stats.admitted.tolist() == [True, True]
    torch.testing.assert_close(current.grad, torch.tensor([[-0.125, -0.125], [0.125, 0.125]], dtype=F64))


def test_sample_mean_weight_per_trajectory_does_not_depend_on_other_lengths():
    def row0_total(other_length):
        width = max(2, other_length)
        current = leaf([[-1.0] * 2 + [0.0] * (width - 2), [-1.0] * width])
        mask = torch.zeros(2, width, dtype=torch.bool)
        mask[0, :2] = True
        mask[1, :other_length] = True
        flashreinforce_loss(current, current.detach(), torch.tensor([1.0, 0.0], dtype=F64), mask).loss.backward()
        return current.grad[0].sum().item()

    assert row0_total(1) == pytest.approx(row0_total(9), rel=1e-14) == pytest.approx(-0.25)


def test_low_precision_inputs_are_promoted_to_float32():
    current = leaf([[-0.5, -0.7], [-0.2, -0.1]], dtype=torch.bfloat16)
    behavior = (current.detach().float() - 0.001).to(torch.bfloat16)
    out = flashreinforce_loss(current, behavior, torch.tensor([1.0, 0.0]), torch.ones(2, 2, dtype=torch.bool))
    out.loss.backward()
    assert out.loss.dtype == torch.float32
    assert out.stats.admitted.all() and torch.isfinite(current.grad.float()).all()


def test_float64_stays_float64():
    current = leaf([[-0.5]])
    out = flashreinforce_loss(current, current.detach(), torch.tensor([1.0], dtype=F64), torch.ones(1, 1, dtype=torch.bool))
    assert out.loss.dtype == F64 and out.stats.advantages.dtype == F64


@pytest.mark.parametrize("make_case, message", [
    (lambda c, b, r, m: (c, b, r, torch.zeros_like(m)), "at least one policy token"),
    (lambda c, b, r, m: (c.detach().clone().index_put_((torch.tensor(0), torch.tensor(0)), torch.tensor(float("nan"), dtype=F64)), b, r, m), "finite and <= 0"),
    (lambda c, b, r, m: (c.detach().abs(), b, r, m), "finite and <= 0"),
    (lambda c, b, r, m: (c, b.abs() + 0.1, r, m), "behavior_log_probs must be finite"),
    (lambda c, b, r, m: (c, b, torch.tensor([float("nan"), 0.0], dtype=F64), m), "rewards must be finite"),
    (lambda c, b, r, m: (c, b, r, m.int()), "bool"),
    (lambda c, b, r, m: (c, b[:, :1], r, m), r"same \[B, T\] shape"),
    (lambda c, b, r, m: (c, b, r[:1], m), "rewards must have shape"),
])
def test_invalid_inputs_name_the_problem(make_case, message):
    current = leaf([[-1.0, -0.5], [-0.2, -0.3]])
    case = make_case(current, current.detach(), torch.tensor([1.0, 0.0], dtype=F64), torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=message):
        flashreinforce_loss(*case, FlashReinforceConfig(delta=INF))


@pytest.mark.parametrize("kwargs, message", [
    ({"entropy_filter_q": 1.1}, "entropy_filter_q"),
    ({"delta": -1.0}, "delta"),
    ({"delta": float("nan")}, "delta"),
    ({"gate_level": "row"}, "gate_level"),
    ({"gate_level": "token", "gate_mean": "geometric"}, "gate_level=sequence"),
    ({"reduction": "constant_length"}, "constant_length"),
    ({"constant_length": 100}, "only used by reduction=constant_length"),
])
def test_invalid_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FlashReinforceConfig(**kwargs)


def test_entropy_filter_requires_labels_and_entropies():
    current = leaf([[-1.0]])
    with pytest.raises(ValueError, match="failures"):
        flashreinforce_loss(current, current.detach(), torch.tensor([1.0], dtype=F64),
                            torch.ones(1, 1, dtype=torch.bool), FlashReinforceConfig(entropy_filter_q=0.5))


def test_non_finite_ratio_on_an_admitted_token_raises():
    current = leaf([[-1e-3], [-1.0]])
    behavior = torch.tensor([[-800.0], [-1.0]], dtype=F64)  # exp(800) overflows float64
    with pytest.raises(ValueError, match="overflowed"):
        flashreinforce_loss(current, behavior, torch.tensor([1.0, 0.0], dtype=F64),
                            torch.ones(2, 1, dtype=torch.bool), FlashReinforceConfig(delta=INF))
    # The same row rejected by the trust region is harmless: its exponent is never taken.
    flashreinforce_loss(current, behavior, torch.tensor([1.0, 0.0], dtype=F64), torch.ones(2, 1, dtype=torch.bool))


def test_slices_with_global_denominators_sum_to_the_batch_loss():
    torch.manual_seed(0)
    current = (-torch.rand(6, 5, dtype=F64) * 2).requires_grad_()
    behavior = current.detach() - torch.rand(6, 5, dtype=F64) * 0.05
    mask = torch.rand(6, 5) < 0.7
    mask[:, 0] = True
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=F64)
    for reduction in ("sample_mean", "token_mean"):
        config = FlashReinforceConfig(delta=1e-3, reduction=reduction)
        whole = flashreinforce_loss(current, behavior, rewards, mask, config)
        advantages = rewards - rewards.mean()
        parts = [flashreinforce_policy_loss(current[s], behavior[s], advantages[s], mask[s], config,
                                            batch_size=6, batch_tokens=int(mask.sum())) for s in (slice(0, 2), slice(2, 6))]
        torch.testing.assert_close(parts[0].loss + parts[1].loss, whole.loss, rtol=1e-12, atol=1e-15)


def literal_transcription(current, behavior, rewards, mask, config, failures, entropies):
    """Row-by-row, token-by-token transcription of the paper's definition (the test's own reference)."""
    batch = len(rewards)
    mean_reward = sum(rewards) / batch
    total_tokens = sum(sum(row) for row in mask)
    loss = 0.0
    for i in range(batch):
        tokens = [t for t in range(len(mask[i])) if mask[i][t]]
        advantage = rewards[i] - mean_reward
        mu_row = behavior[i] if config.importance_sampling else current[i]

        def kl(t):
            p = min(max(math.exp(mu_row[t]), 1e-6), 1 - 1e-6)
            q = min(max(math.exp(current[i][t]), 1e-6), 1 - 1e-6)
            return p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))

        if not config.importance_sampling:
            admitted = set(tokens)  # no-IS has no gate
        elif config.gate_level == "sequence":
            kls = [max(kl(t), 0.0) for t in tokens]
            if config.gate_mean == "arithmetic":
                row_kl = sum(kls) / len(tokens)
            else:
                row_kl = 0.0 if min(kls) == 0.0 else math.exp(sum(math.log(d) for d in kls) / len(tokens))
            admitted = {t for t in tokens if row_kl <= config.delta}
        else:
            admitted = {t for t in tokens if kl(t) <= config.delta}
        kept = set(tokens)
        if config.entropy_filter_q < 1 and failures[i]:
            count = math.ceil(round(config.entropy_filter_q * len(tokens), 9))
            ranked = sorted(tokens, key=lambda t: (-entropies[i][t], t))
            kept = set(ranked[:count])
        denominator = {"sample_mean": len(tokens) * batch, "token_mean": total_tokens,
                       "constant_length": (config.constant_length or 0) * batch}[config.reduction]
        for t in admitted & kept:
            ratio = math.exp(current[i][t] - mu_row[t])
            loss -= ratio * advantage * current[i][t] / denominator
    return loss


@pytest.mark.parametrize("gate_level, gate_mean, reduction, importance_sampling, q", [
    combo for combo in itertools.product(("sequence", "token"), ("arithmetic", "geometric"),
                                         ("sample_mean", "token_mean", "constant_length"), (True, False),
                                         (1.0, 0.4))
    if not (combo[0] == "token" and combo[1] == "geometric")
])
def test_matches_literal_transcription(gate_level, gate_mean, reduction, importance_sampling, q):
    generator = torch.Generator().manual_seed(7)
    batch, width = 7, 9
    current = (-torch.rand(batch, width, generator=generator, dtype=F64) * 3).requires_grad_()
    drift = torch.rand(batch, 1, generator=generator, dtype=F64) * torch.rand(batch, width, generator=generator, dtype=F64)
    behavior = current.detach() - drift * 0.3
    mask = torch.rand(batch, width, generator=generator) < 0.6
    mask[:, 0] = True
    rewards = torch.randint(0, 2, (batch,), generator=generator).to(F64)
    failures = rewards == 0
    entropies = torch.rand(batch, width, generator=generator, dtype=F64)
    config = FlashReinforceConfig(delta=2e-3, gate_level=gate_level, gate_mean=gate_mean, reduction=reduction,
                                  constant_length=12 if reduction == "constant_length" else None,
                                  importance_sampling=importance_sampling, entropy_filter_q=q)
    out = flashreinforce_loss(current, behavior, rewards, mask, config, failures=failures, entropies=entropies)
    expected = literal_transcription(current.detach().tolist(), behavior.tolist(), rewards.tolist(),
                                     mask.tolist(), config, failures.tolist(), entropies.tolist())
    assert 0 < out.stats.acceptance_rate.item() < 1 or not importance_sampling or gate_mean == "geometric"
    assert out.loss.item() == pytest.approx(expected, rel=1e-10, abs=1e-14)


def test_entropy_filter_selection_on_tie_heavy_random_rows():
    """Integer entropies make ties common; the kept set must equal a stable sort's first ceil(q*T_i)."""
    generator = torch.Generator().manual_seed(1)
    for trial in range(200):
        width = int(torch.randint(1, 30, (1,), generator=generator))
        mask = torch.rand(5, width, generator=generator) < 0.7
        mask[:, 0] = True
        entropies = torch.randint(0, 4, (5, width), generator=generator).to(F64)
        failures = torch.rand(5, generator=generator) < 0.6
        q = float(torch.rand(1, generator=generator)) if trial % 3 else float(trial % 2)
        current = torch.full((5, width), -1.0, dtype=F64)
        out = flashreinforce_loss(current, current, torch.arange(5, dtype=F64), mask,
                                  FlashReinforceConfig(delta=INF, entropy_filter_q=q),
                                  failures=failures, entropies=entropies)
        for row in range(5):
            tokens = mask[row].nonzero().flatten().tolist()
            expected = len(tokens)
            if failures[row]:
                expected = math.ceil(round(q * len(tokens), 9))
            assert out.stats.retained_tokens[row].item() == expected
        kept = out.token_weights != 0
        for row in range(5):
            if not failures[row] or row == 2:  # row 2 has advantage 0, so its weights are 0 anyway
                continue
            tokens = mask[row].nonzero().flatten().tolist()
            ranked = sorted(tokens, key=lambda t: (-entropies[row, t].item(), t))
            assert set(kept[row].nonzero().flatten().tolist()) == set(ranked[:math.ceil(round(q * len(tokens), 9))])
