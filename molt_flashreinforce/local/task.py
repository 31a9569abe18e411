"""The CPU task: two-number addition with a checkable answer of varying length.

A prompt is `<bos> a + b =` with both operands zero-padded to the same width, so every prompt
has the same length; the answer is the sum's decimal digits without leading zeros, then
`<eos>` (for max_operand=99: 1 to 3 digits). The reward is 1 for an exact answer followed by
`<eos>`, else 0. Copying any part of the prompt does not solve it.

A fixed held-out set (`eval_problems`, drawn with its own seed: addition_split.py) is never used
for training: `sample_problems` draws only from the remaining problems.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from molt_flashreinforce.addition_split import held_out_split, operands

DIGITS = tuple(str(d) for d in range(10))
PLUS, EQUALS, EOS, BOS, PAD = 10, 11, 12, 13, 14
VOCAB = (*DIGITS, "+", "=", "<eos>", "<bos>", "<pad>")


@dataclass(frozen=True)
class Problems:
    prompt_ids: torch.Tensor  # [N, P] long, all the same length
    answers: torch.Tensor  # [N] long, a + b


class AdditionTask:
    vocab_size = len(VOCAB)
    eos_id = EOS
    bos_id = BOS
    pad_id = PAD

    def __init__(self, max_operand: int, eval_size: int, eval_seed: int) -> None:
        self.max_operand = max_operand
        self.operand_width = len(str(max_operand))
        self.max_new_tokens = len(str(2 * max_operand)) + 1  # the longest answer plus <eos>
        self._eval_index, self._train_index = held_out_split(max_operand, eval_size, eval_seed)

    @property
    def prompt_length(self) -> int:
        return 3 + 2 * self.operand_width

    def eval_problems(self) -> Problems:
        return self._problems(self._eval_index)

    def sample_problems(self, n: int, generator: torch.Generator) -> Problems:
        pick = torch.randint(len(self._train_index), (n,), generator=generator)
        return self._problems(self._train_index[pick])

    def _problems(self, index: torch.Tensor) -> Problems:
        a, b = operands(index, self.max_operand)
        column = lambda token: torch.full_like(a, token)[:, None]  # noqa: E731
        prompt = torch.cat(
            [column(BOS), self._digits(a), column(PLUS), self._digits(b), column(EQUALS)], dim=1
        )
        return Problems(prompt_ids=prompt, answers=a + b)

    def _digits(self, x: torch.Tensor) -> torch.Tensor:
        powers = 10 ** torch.arange(self.operand_width - 1, -1, -1)
        return (x[:, None] // powers) % 10

    def answer_tokens(self, answers: torch.Tensor) -> torch.Tensor:
        """[N, max_new_tokens] target responses: the sum's digits, <eos>, then <pad>."""
        out = torch.full((len(answers), self.max_new_tokens), PAD, dtype=torch.long)
        for row, value in enumerate(answers.tolist()):
            tokens = [int(c) for c in str(value)] + [EOS]
            out[row, : len(tokens)] = torch.tensor(tokens)
        return out

    def rewards(self, response_ids: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
        """1.0 where the response is exactly the answer's digits then <eos>, else 0.0.

        `response_ids` [N, T] holds <pad> after a row's <eos>; T may be shorter than
        max_new_tokens when every row stopped early.
        """
        target = self.answer_tokens(answers)
        steps = response_ids.shape[1]
        padded = torch.full((len(answers), self.max_new_tokens), PAD, dtype=torch.long)
        padded[:, :steps] = response_ids[:, : self.max_new_tokens]
        return (padded == target).all(dim=1).float()
