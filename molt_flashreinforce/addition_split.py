"""The CPU experiment's addition problems: which `a + b` pairs are held out for evaluation.

    held_out_split(max_operand, eval_size, eval_seed) -> (eval_index, train_index)
    operands(index, max_operand) -> (a, b)

Problem i is the pair (i // (max_operand + 1), i % (max_operand + 1)). One permutation seeded by
`eval_seed` puts `eval_size` problems (sorted) in the held-out set and the rest in the training
set. The CPU backend's task (local/task.py) and the data command's Molt rows (data/tiny_rows.py)
both take it from here, so they hold out the same problems.
"""

from __future__ import annotations

import torch


def held_out_split(max_operand: int, eval_size: int, eval_seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.randperm((max_operand + 1) ** 2, generator=torch.Generator().manual_seed(eval_seed))
    return order[:eval_size].sort().values, order[eval_size:]


def operands(index: torch.Tensor, max_operand: int) -> tuple[torch.Tensor, torch.Tensor]:
    return index // (max_operand + 1), index % (max_operand + 1)
