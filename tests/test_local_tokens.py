"""The local backend's cumulative token counters on hand-made batches: generated tokens are the
response mask's sum, trained tokens add the prompt tokens, and a trainer restored from
`state_dict()` continues both."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from molt_flashreinforce import metrics as tags
from molt_flashreinforce.local.config import LocalConfig
from molt_flashreinforce.local.sampler import Rollouts
from molt_flashreinforce.local.task import EOS, PAD
from molt_flashreinforce.local.trainer import LocalTrainer

FLASH = OmegaConf.create({"name": "flashreinforce", "group_size": 1, "delta": float("inf")})
# max_operand 9: prompts `<bos> a + b =` are 5 tokens, responses at most 3 ("18" and <eos>).
CONFIG = LocalConfig.from_node(dict(
    steps=2, rollouts_per_step=4, policy_lag=0, progress_bar=False,
    task={"max_operand": 9, "eval_size": 10}, model={"n_layer": 1, "n_embd": 16, "n_head": 2},
))
PROMPT_TOKENS = 5


def batch(trainer: LocalTrainer, lengths: list[int]) -> tuple[Rollouts, torch.Tensor]:
    """Four rollouts whose responses are `lengths` tokens long (digits, then <eos>)."""
    problems = trainer.task.sample_problems(len(lengths), torch.Generator().manual_seed(len(lengths)))
    width = max(lengths)
    response = torch.full((len(lengths), width), PAD)
    mask = torch.zeros((len(lengths), width), dtype=torch.bool)
    for row, length in enumerate(lengths):
        response[row, : length - 1] = 1
        response[row, length - 1] = EOS
        mask[row, :length] = True
    rollouts = Rollouts(prompt_ids=problems.prompt_ids, response_ids=response, mask=mask,
                        log_probs=torch.where(mask, -1.0, 0.0), truncated=torch.zeros(len(lengths), dtype=torch.bool),
                        behavior_version=trainer.version)
    return rollouts, problems.answers


def test_counters_are_the_mask_sum_and_prompt_plus_response_tokens():
    trainer = LocalTrainer(CONFIG, FLASH, seed=0)
    assert trainer.task.prompt_length == PROMPT_TOKENS
    logged = trainer.update(*batch(trainer, [1, 2, 3, 2]))
    assert logged[tags.GENERATED_TOKENS] == 1 + 2 + 3 + 2 == 8
    assert logged[tags.TRAINED_TOKENS] == 4 * PROMPT_TOKENS + 8 == 28
    logged = trainer.update(*batch(trainer, [3, 3, 1, 1]))
    assert logged[tags.GENERATED_TOKENS] == 8 + 8
    assert logged[tags.TRAINED_TOKENS] == 28 + 4 * PROMPT_TOKENS + 8 == 56


def test_a_restored_trainer_continues_the_counters():
    trainer = LocalTrainer(CONFIG, FLASH, seed=0)
    trainer.update(*batch(trainer, [1, 2, 3, 2]))
    restored = LocalTrainer(CONFIG, FLASH, seed=0)
    restored.load_state_dict(trainer.state_dict())
    logged = restored.update(*batch(restored, [3, 3, 1, 1]))
    assert (logged[tags.GENERATED_TOKENS], logged[tags.TRAINED_TOKENS]) == (16, 56)
