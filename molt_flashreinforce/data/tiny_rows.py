"""The CPU experiment's addition problems as Molt math rows (the local backend's own split).

Eval rows are the local task's held-out problems, train rows every other ``a + b`` pair, with
the operand range and seed read from ``conf/experiment/tiny.yaml``'s ``local.task``, so Molt's
math agent can run the tiny task too.
"""

from __future__ import annotations

import os

from omegaconf import OmegaConf

from molt_flashreinforce.data.math_rows import prompt_messages
from molt_flashreinforce.local.task import AdditionTask

TINY_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "experiment", "tiny.yaml")


def _held_out_pairs(task: AdditionTask) -> list[tuple[int, int]]:
    # A prompt is <bos> a-digits + b-digits =, digits being token ids 0-9.
    width = task.operand_width
    number = lambda ids: int("".join(str(d) for d in ids))  # noqa: E731
    return [(number(p[1 : 1 + width]), number(p[2 + width : 2 + 2 * width])) for p in task.eval_problems().prompt_ids.tolist()]


def tiny_rows(output: str) -> list[dict]:
    task = OmegaConf.load(TINY_CONFIG).local.task
    max_operand = int(task.max_operand)
    held_out = _held_out_pairs(AdditionTask(max_operand, int(task.eval_size), int(task.eval_seed)))
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
