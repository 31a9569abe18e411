"""The CPU experiment's addition problems as Molt math rows (the local backend's own split).

Eval rows are the local task's held-out problems, train rows every other ``a + b`` pair, with
the operand range and seed of ``conf/experiment/tiny.yaml``'s ``local.task``, so Molt's math
agent can run the tiny task too.
"""

from __future__ import annotations

from molt_flashreinforce.data.math_rows import prompt_messages
from molt_flashreinforce.local.task import AdditionTask

MAX_OPERAND, EVAL_SIZE, EVAL_SEED = 99, 512, 1234


def _held_out_pairs(task: AdditionTask) -> list[tuple[int, int]]:
    # A prompt is <bos> a-digits + b-digits =, digits being token ids 0-9.
    width = task.operand_width
    number = lambda ids: int("".join(str(d) for d in ids))  # noqa: E731
    return [(number(p[1 : 1 + width]), number(p[2 + width : 2 + 2 * width])) for p in task.eval_problems().prompt_ids.tolist()]


def tiny_rows(output: str) -> list[dict]:
    held_out = _held_out_pairs(AdditionTask(MAX_OPERAND, EVAL_SIZE, EVAL_SEED))
    if output == "eval":
        pairs = held_out
    else:
        excluded = set(held_out)
        pairs = [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1) if (a, b) not in excluded]
    return [
        {
            "prompt": prompt_messages(f"What is {a} + {b}?", "boxed"),
            "reward_model": {"ground_truth": str(a + b)},
            "datasource": "tiny",
        }
        for a, b in pairs
    ]
