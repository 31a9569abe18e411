"""Full-vocabulary token entropies from logits, in bounded memory and without a graph.

    token_entropy(logits [..., V], temperature=1.0) -> entropies [...] (float32, no grad)

The entropy of softmax(logits / temperature) at every position. The entropy filter only ranks
tokens, so no gradient flows through it. The positions are processed a slab of
`_SLAB_ELEMENTS` logits at a time, each slab upcast to float32 on its own, so the extra memory
is a few slabs (about 200 MiB) whatever T and V are and whatever the input dtype: the bf16
logits a forward pass holds are read in place, never copied whole to float32 (for T=8192,
V=151,936 one such copy is 5 GB). Each slab is scaled in float32 after the upcast, exactly as
Molt's `Actor.forward` scales its float32 logits, so the distribution is the one Molt's
entropy path feeds `compute_entropy`.

A vocabulary-sharded DTensor (tensor parallelism) is gathered one slab at a time.
"""

from __future__ import annotations

import itertools

import torch
from torch.distributed.tensor import DTensor

_SLAB_ELEMENTS = 1 << 24


@torch.no_grad()
def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    vocab = logits.shape[-1]
    positions = logits.shape[:-1]
    rows_per_slab = max(1, _SLAB_ELEMENTS // vocab)
    entropies = torch.empty(positions.numel(), dtype=torch.float32, device=logits.device)
    for start, logits_slab in _row_slabs(logits, rows_per_slab):
        scaled = logits_slab.to(torch.float32)
        if temperature != 1.0:
            scaled = scaled / temperature
        # H = m + log Z - sum_v p_v z_v, with m the row max, Z = sum_v exp(z_v - m) and
        # p = exp(z - m) / Z: one exponential pass serves both sums, and p * z reuses its buffer.
        row_max = scaled.amax(dim=-1, keepdim=True)
        unnormalized = torch.sub(scaled, row_max).exp_()
        partition = unnormalized.sum(dim=-1)
        expected_logit = unnormalized.mul_(scaled).sum(dim=-1) / partition
        entropies[start:start + logits_slab.shape[0]] = row_max.squeeze(-1) + partition.log() - expected_logit
    return entropies.reshape(positions)


def _row_slabs(logits: torch.Tensor, rows_per_slab: int):
    """(first flat position, [rows, V] plain tensor) for consecutive slabs of positions."""
    if not isinstance(logits, DTensor):
        flat = logits.reshape(-1, logits.shape[-1])
        for start in range(0, flat.shape[0], rows_per_slab):
            yield start, flat[start:start + rows_per_slab]
        return
    # Indexing the unsharded leading dims keeps the vocabulary sharding; only the slab is gathered.
    *leading, length = logits.shape[:-1]
    start = 0
    for index in itertools.product(*map(range, leading)):
        rows = logits[index] if index else logits
        for offset in range(0, length, rows_per_slab):
            slab = rows[offset:offset + rows_per_slab].full_tensor()
            yield start, slab
            start += slab.shape[0]
