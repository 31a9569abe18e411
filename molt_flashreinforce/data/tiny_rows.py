"""The CPU experiment's addition problems as Molt math rows (the local backend's own split).

Eval rows are the held-out problems, train rows every other ``a + b`` pair, with the operand range
and seed read from ``conf/experiment/tiny.yaml``'s ``local.task`` and the split from
``addition_split``, so Molt's math agent can run the tiny task too.
"""

from __future__ import annotations

import os

from omegaconf import OmegaConf

from molt_flashreinforce.addition_split import held_out_split, operands
from molt_flashreinforce.data.math_rows import prompt_messages

TINY_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "experiment", "tiny.yaml")


def tiny_rows(output: str) -> list[dict]:
    task = OmegaConf.load(TINY_CONFIG).local.task
    max_operand = int(task.max_operand)
    eval_index, _ = held_out_split(max_operand, int(task.eval_size), int(task.eval_seed))
    held_out = list(zip(*(side.tolist() for side in operands(eval_index, max_operand))))
    if output == "eval":
        pairs = held_out
    else:
        excluded = set(held_out)
        pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1) if (a, b) not in excluded]
    return [
        {
            "prompt": prompt_messages(f"What is {a} + {b}?", "boxed"),
            "reward_model": {"ground_truth": str(a + b)},
            "datasource": "tiny",
        }
        for a, b in pairs
    ]
