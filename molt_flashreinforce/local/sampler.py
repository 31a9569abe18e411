"""Batched temperature sampling with a KV cache, storing each sampled token's log-prob.

    sample(policy, prompt_ids, max_new_tokens, temperature, generator, eos_id, pad_id) -> Rollouts

Every prompt in a batch has the same length (the task guarantees it), so no left padding is
needed. A row stops at its <eos>; later slots hold <pad> and are outside `mask`. The stored
log-probs are those of the distribution the token was actually drawn from (softmax of
logits / temperature, no top-p truncation): the behaviour log-probs mu of the objective.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rollouts:
    prompt_ids: torch.Tensor  # [B, P]
    response_ids: torch.Tensor  # [B, T] long, <pad> after <eos>
    mask: torch.Tensor  # [B, T] bool: policy tokens (up to and including <eos>)
    log_probs: torch.Tensor  # [B, T] float32 sampling log-probs (0 outside mask)
    truncated: torch.Tensor  # [B] bool: no <eos> within max_new_tokens
    behavior_version: int  # the policy version (number of updates) that sampled this batch


@torch.no_grad()
def sample(
    policy,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator,
    eos_id: int,
    pad_id: int,
    behavior_version: int = 0,
) -> Rollouts:
    batch = prompt_ids.shape[0]
    out = policy(input_ids=prompt_ids, use_cache=True)
    cache, logits = out.past_key_values, out.logits[:, -1]
    device = prompt_ids.device
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    tokens, log_probs, masks = [], [], []
    for step in range(max_new_tokens):
        step_log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
        token = torch.multinomial(step_log_probs.exp(), 1, generator=generator).squeeze(1)
        active = ~finished
        token = torch.where(active, token, torch.full_like(token, pad_id))
        tokens.append(token)
        taken = step_log_probs.gather(1, token[:, None]).squeeze(1)
        log_probs.append(torch.where(active, taken, torch.zeros_like(taken)))
        masks.append(active)
        finished = finished | (token == eos_id)
        if finished.all() or step == max_new_tokens - 1:
            break
        out = policy(input_ids=token[:, None], past_key_values=cache, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
    return Rollouts(
        prompt_ids=prompt_ids,
        response_ids=torch.stack(tokens, dim=1),
        mask=torch.stack(masks, dim=1),
        log_probs=torch.stack(log_probs, dim=1),
        truncated=~finished,
        behavior_version=behavior_version,
    )
