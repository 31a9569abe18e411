"""The ChatML turn boundary that multi-turn agents append after each model action.

Every model of the paper's agent experiments (Qwen2.5-Instruct, Qwen3) uses ChatML. Molt's
``StepEnvRunner`` appends an ``Env.step`` observation verbatim after the action tokens (and
masks it out of the loss), so the observation must close the assistant turn, carry the
environment's message as the next user turn, and reopen the assistant turn.
"""

from __future__ import annotations

IM_END = "<|im_end|>"


def next_user_turn(action_text: str, content: str) -> str:
    """Observation text that follows ``action_text``: ``content`` as a user turn, then the
    assistant prompt. The end-of-turn token is added only when the action lacks it (it is
    present when the model stopped on EOS, absent when it was cut off)."""
    close = "" if action_text.rstrip().endswith(IM_END) else IM_END
    return f"{close}\n<|im_start|>user\n{content}{IM_END}\n<|im_start|>assistant\n"
