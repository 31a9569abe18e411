"""The ChatML turn boundary that multi-turn agents append after each model action.

Every model of the paper's agent experiments (Qwen2.5-Instruct, Qwen3) uses ChatML. Molt's
``StepEnvRunner`` appends an ``Env.step`` observation verbatim after the action tokens (and
masks it out of the loss), so the observation must close the assistant turn, carry the
environment's message as the next user turn, and reopen the assistant turn.

Thinking off (``ENABLE_THINKING=false`` in the agent's environment, set by the launcher from
``agent.enable_thinking``): every assistant turn opens with an empty think block, which is what
Qwen3's chat template appends to the generation prompt under ``enable_thinking=False``. Molt
0.2.1 renders the dataset prompt with the tokenizer's template and no such argument, so
``open_first_turn`` adds the block to that rendered prompt and ``next_user_turn`` to every later
turn. Unset leaves the template's default (Qwen3: thinking on).
"""

from __future__ import annotations

import os

IM_END = "<|im_end|>"
ASSISTANT_PROMPT = "<|im_start|>assistant\n"
# Qwen3's template under enable_thinking=False: `<|im_start|>assistant\n<think>\n\n</think>\n\n`.
EMPTY_THINK_BLOCK = "<think>\n\n</think>\n\n"


def thinking_disabled() -> bool:
    raw = os.environ.get("ENABLE_THINKING", "").strip().lower()
    if raw not in ("", "true", "false"):
        raise ValueError(f"ENABLE_THINKING must be true or false (unset: the chat template's default), got {raw!r}.")
    return raw == "false"


def _assistant_prompt() -> str:
    return ASSISTANT_PROMPT + (EMPTY_THINK_BLOCK if thinking_disabled() else "")


def open_first_turn(rendered_prompt: str) -> str:
    """The dataset's rendered prompt, with the empty think block when thinking is off."""
    if not thinking_disabled():
        return rendered_prompt
    if not rendered_prompt.endswith(ASSISTANT_PROMPT):
        raise ValueError("ENABLE_THINKING=false needs the prompt rendered with the chat template's generation prompt "
                         f"(ending in {ASSISTANT_PROMPT!r}); pass --data.apply_chat_template (molt.data.apply_chat_template).")
    return rendered_prompt + EMPTY_THINK_BLOCK


def next_user_turn(action_text: str, content: str) -> str:
    """Observation text that follows ``action_text``: ``content`` as a user turn, then the
    assistant prompt. The end-of-turn token is added only when the action lacks it (it is
    present when the model stopped on EOS, absent when it was cut off)."""
    close = "" if action_text.rstrip().endswith(IM_END) else IM_END
    return f"{close}\n<|im_start|>user\n{content}{IM_END}\n{_assistant_prompt()}"
