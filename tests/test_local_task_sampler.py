"""The local backend's task (prompt layout, answers, reward) and sampler (KV cache, stored log-probs)."""

from __future__ import annotations

import torch

from molt_flashreinforce.local.config import ModelConfig
from molt_flashreinforce.local.model import build_policy, response_log_probs
from molt_flashreinforce.local.sampler import sample
from molt_flashreinforce.local.task import BOS, EOS, EQUALS, PAD, PLUS, AdditionTask


def _task(max_operand=99, eval_size=64):
    return AdditionTask(max_operand=max_operand, eval_size=eval_size, eval_seed=7)


def test_prompt_layout_and_answers_by_hand():
    task = _task()
    problems = task._problems(torch.tensor([7 * 100 + 35, 99 * 100 + 99, 0]))
    assert problems.prompt_ids.tolist() == [
        [BOS, 0, 7, PLUS, 3, 5, EQUALS],
        [BOS, 9, 9, PLUS, 9, 9, EQUALS],
        [BOS, 0, 0, PLUS, 0, 0, EQUALS],
    ]
    assert problems.answers.tolist() == [42, 198, 0]
    assert task.answer_tokens(problems.answers).tolist() == [[4, 2, EOS, PAD], [1, 9, 8, EOS], [0, EOS, PAD, PAD]]
    assert task.max_new_tokens == 4 and task.prompt_length == 7


def test_reward_is_exact_match_with_eos():
    task = _task()
    answers = torch.tensor([42, 42, 42, 42, 42, 5])
    responses = torch.tensor([
        [4, 2, EOS, PAD],  # right
        [4, 3, EOS, PAD],  # wrong digit
        [4, 2, 2, EOS],  # extra digit
        [4, 2, 1, 1],  # no <eos> (truncated)
        [2, 4, EOS, PAD],  # digits reversed
        [5, EOS, PAD, PAD],  # right, one digit
    ])
    assert task.rewards(responses, answers).tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    # Responses shorter than max_new_tokens (every row stopped early) are padded, not misread.
    assert task.rewards(torch.tensor([[5, EOS]]), torch.tensor([5])).tolist() == [1.0]
    assert task.rewards(torch.tensor([[5]]), torch.tensor([5])).tolist() == [0.0]


def test_eval_set_is_held_out_and_answers_vary_in_length():
    task = _task(eval_size=500)
    eval_pairs = set(map(tuple, task.eval_problems().prompt_ids.tolist()))
    assert len(eval_pairs) == 500
    train = task.sample_problems(4000, torch.Generator().manual_seed(0))
    assert not eval_pairs & set(map(tuple, train.prompt_ids.tolist()))
    lengths = {len(str(v)) for v in train.answers.tolist()}
    assert lengths == {1, 2, 3}


def test_copying_an_operand_almost_never_answers():
    task = _task()
    everything = task._problems(torch.arange(100 * 100))
    ids = everything.prompt_ids
    a, b = ids[:, 1] * 10 + ids[:, 2], ids[:, 4] * 10 + ids[:, 5]
    copy_solves = ((a == everything.answers) | (b == everything.answers)).float().mean()
    assert copy_solves < 0.02  # only a + 0 and 0 + b


def _policy(task, seed=0):
    return build_policy(ModelConfig(n_layer=1, n_embd=32, n_head=2), task, seed)


def test_stored_log_probs_equal_a_full_forward_recomputation():
    task = _task()
    policy = _policy(task)
    prompts = task.sample_problems(64, torch.Generator().manual_seed(1)).prompt_ids
    for temperature in (1.0, 0.7):
        rollouts = sample(policy, prompts, task.max_new_tokens, temperature, torch.Generator().manual_seed(2),
                          task.eos_id, task.pad_id)
        recomputed, _ = response_log_probs(policy, prompts, rollouts.response_ids, temperature)
        mask = rollouts.mask
        assert torch.allclose(rollouts.log_probs[mask], recomputed.detach()[mask], atol=1e-5)
        assert (rollouts.log_probs[~mask] == 0).all()


def test_mask_covers_tokens_up_to_eos_and_pads_after():
    task = _task()
    policy = _policy(task)
    prompts = task.sample_problems(256, torch.Generator().manual_seed(3)).prompt_ids
    rollouts = sample(policy, prompts, task.max_new_tokens, 1.0, torch.Generator().manual_seed(4),
                      task.eos_id, task.pad_id)
    for tokens, mask, truncated in zip(rollouts.response_ids.tolist(), rollouts.mask.tolist(), rollouts.truncated):
        eos = tokens.index(EOS) if EOS in tokens else None
        length = len(tokens) if eos is None else eos + 1
        assert mask == [True] * length + [False] * (len(tokens) - length)
        assert all(t == PAD for t in tokens[length:])
        assert bool(truncated) == (eos is None)
    assert rollouts.truncated.any() and not rollouts.truncated.all()  # a random policy does both


def test_first_tokens_follow_the_stored_distribution():
    """Sampling at temperature T draws from softmax(logits / T): frequencies match exp(stored log-prob)."""
    task = _task()
    policy = _policy(task, seed=5)
    n = 20000
    prompts = task._problems(torch.tensor([1234])).prompt_ids.expand(n, -1)
    rollouts = sample(policy, prompts, 1, 0.5, torch.Generator().manual_seed(6), task.eos_id, task.pad_id)
    first, probs = rollouts.response_ids[:, 0], rollouts.log_probs[:, 0].exp()
    for token in first.unique():
        observed = (first == token).float().mean()
        expected = probs[first == token][0]
        assert abs(observed - expected) < 4 * (expected * (1 - expected) / n) ** 0.5 + 1e-3
