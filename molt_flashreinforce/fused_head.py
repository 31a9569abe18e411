"""The output layer and the sampled-token log-probs in one chunked pass: the [N, V] logits are
never held, only one chunk of them at a time.

    chunked_log_probs(hidden [..., H], weight [V, H], targets [...], temperature=1.0,
                      with_entropy=False, chunk_elements=2**24)
        -> (log_probs [...] float32, with gradient to hidden and weight;
            entropy [...] float32 without gradient, or None)
    head_computing_log_probs(linear, targets_for, temperature, with_entropy)
        context: while inside, `linear(hidden)` returns those log-probs at `targets_for(hidden's
        token shape)` instead of the logits; the targets and entropies used are left on the
        yielded object

The log-probs are those of log_softmax(hidden @ weight.T / temperature) at `targets`, computed as
Molt's stock path computes them: the logits in the weight's dtype, upcast to float32, then divided
by the temperature. Backward recomputes each chunk's logits (one more matmul per chunk) instead of
keeping them; the chunk's logit gradient is rounded to the weight's dtype as the stock path's
upcast rounds it, and the weight's gradient is summed over chunks in float32. The entropy of the
same distribution is computed from the chunk already in hand, for the entropy filter, which only
ranks tokens.

A chunk holds about `chunk_elements` logits (at least one token). The computation runs inside the
linear module's own forward, so a data-parallel wrapper that gathers the module's weight around its
forward and backward (FSDP2's `fully_shard`) gathers it around this computation too. The weight must
be a plain tensor there: a vocabulary-sharded (tensor-parallel) weight is not supported.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

CHUNK_ELEMENTS = 1 << 24  # 64 MiB of float32 logits, the entropy slabs' size (entropy.py)


def chunk_tokens(vocab: int, chunk_elements: int = CHUNK_ELEMENTS) -> int:
    return max(1, chunk_elements // vocab)


def _chunk_logits(hidden_chunk, weight, temperature):
    logits = (hidden_chunk @ weight.t()).to(torch.float32)
    return logits / temperature if temperature != 1.0 else logits


class _ChunkedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, with_entropy, tokens_per_chunk):
        count = hidden.shape[0]
        log_probs = torch.empty(count, dtype=torch.float32, device=hidden.device)
        normalizers = torch.empty(count, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(count if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        for start in range(0, count, tokens_per_chunk):
            rows = slice(start, start + tokens_per_chunk)
            logits = _chunk_logits(hidden[rows], weight, temperature)
            normalizer = torch.logsumexp(logits, dim=-1)
            log_probs[rows] = logits.gather(-1, targets[rows].unsqueeze(-1)).squeeze(-1) - normalizer
            normalizers[rows] = normalizer
            if with_entropy:
                # H = -sum_v p_v log p_v with log p = z - log Z, shifted in the chunk's own buffer.
                token_log_probs = logits.sub_(normalizer.unsqueeze(-1))
                entropy[rows] = -(token_log_probs.exp() * token_log_probs).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, normalizers)
        ctx.temperature, ctx.tokens_per_chunk = temperature, tokens_per_chunk
        ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, _grad_entropy):
        hidden, weight, targets, normalizers = ctx.saved_tensors
        temperature = ctx.temperature
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        for start in range(0, hidden.shape[0], ctx.tokens_per_chunk):
            rows = slice(start, start + ctx.tokens_per_chunk)
            # d log p_t / d z_v = (1[v = t] - p_v) / T for the raw logits z.
            grad_logits = _chunk_logits(hidden[rows], weight, temperature)
            grad_logits.sub_(normalizers[rows].unsqueeze(-1)).exp_().neg_()
            grad_logits.scatter_add_(-1, targets[rows].unsqueeze(-1),
                                     torch.ones_like(grad_logits[:, :1]))
            grad_logits.mul_((grad_log_probs[rows] / temperature).unsqueeze(-1))
            grad_logits = grad_logits.to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t().to(torch.float32), hidden[rows].to(torch.float32))
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def chunked_log_probs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                      with_entropy: bool = False, chunk_elements: int = CHUNK_ELEMENTS):
    leading = hidden.shape[:-1]
    if targets.shape != leading:
        raise ValueError(f"targets have shape {tuple(targets.shape)}, the hidden states' tokens {tuple(leading)}")
    log_probs, entropy = _ChunkedLogProbs.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1), float(temperature), with_entropy,
        chunk_tokens(weight.shape[0], chunk_elements))
    return log_probs.reshape(leading), entropy.reshape(leading) if with_entropy else None


class HeadCall:
    """What a linear head computes while installed; `targets` and `entropy` are the latest call's."""

    def __init__(self, linear: nn.Linear, targets_for: Callable[[torch.Size], torch.Tensor], temperature: float,
                 with_entropy: bool):
        self.linear, self.targets_for, self.temperature, self.with_entropy = linear, targets_for, temperature, with_entropy
        self.targets = self.entropy = None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.linear.weight
        if isinstance(weight, DTensor):
            raise ValueError("the fused head needs the whole lm_head weight in its forward; a vocabulary-parallel "
                             "(tensor-parallel) lm_head is not supported: turn the fused head off")
        self.targets = self.targets_for(hidden.shape[:-1])
        log_probs, self.entropy = chunked_log_probs(hidden, weight, self.targets, self.temperature, self.with_entropy)
        return log_probs


@contextmanager
def head_computing_log_probs(linear: nn.Linear, targets_for: Callable[[torch.Size], torch.Tensor], temperature: float,
                             with_entropy: bool):
    """Replace `linear`'s forward on this instance only; module hooks (FSDP2's gathers) still run."""
    if getattr(linear, "bias", None) is not None:
        raise ValueError("the fused head supports an output layer without bias (the causal LMs' lm_head)")
    call = HeadCall(linear, targets_for, temperature, with_entropy)
    linear.forward = call
    try:
        yield call
    finally:
        del linear.forward
