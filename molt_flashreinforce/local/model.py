"""The tiny causal LM: a GPT-2 built from a `transformers` config with random weights.

Nothing is downloaded. Dropout is off so a forward pass is a deterministic function of the
weights: the stored sampling log-probs can then be checked against a recomputation.
"""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from molt_flashreinforce.local.config import ModelConfig
from molt_flashreinforce.local.task import AdditionTask


def build_policy(model: ModelConfig, task: AdditionTask, seed: int) -> GPT2LMHeadModel:
    config = GPT2Config(
        vocab_size=task.vocab_size,
        n_positions=task.prompt_length + task.max_new_tokens,
        n_embd=model.n_embd,
        n_layer=model.n_layer,
        n_head=model.n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=task.bos_id,
        eos_token_id=task.eos_id,
        pad_token_id=None,  # <pad> only ever follows <eos>: causal attention keeps it out of every scored token
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = GPT2LMHeadModel(config)
    return policy.eval()


def response_log_probs(
    policy: GPT2LMHeadModel,
    prompt_ids: torch.Tensor,
    response_ids: torch.Tensor,
    temperature: float,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B, T] float32 log pi(response_t | prompt, response_<t) at `temperature`, as Molt's actor
    computes it (logits divided by the rollout temperature), keeping the autograd graph; and,
    if asked, the detached entropy of each step's full distribution (the entropy filter's input)."""
    sequence = torch.cat([prompt_ids, response_ids], dim=1)
    logits = policy(input_ids=sequence).logits[:, prompt_ids.shape[1] - 1 : -1]
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    taken = log_probs.gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return taken, None
    detached = log_probs.detach()
    return taken, -(detached.exp() * detached).sum(dim=-1)
