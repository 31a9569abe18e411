"""Full-vocabulary token entropies from logits, in bounded memory and without a graph.

    token_entropy(logits [..., V]) -> entropies [...] (float32, no grad)

The entropy filter only ranks tokens, so no gradient flows through it. Working through the
flattened positions a slab at a time keeps the extra memory at a few slabs of
`_SLAB_ELEMENTS` floats (about 200 MiB) whatever T and V are, instead of the several
[T, V] float32 temporaries (softmax, product, upcast) a one-shot computation allocates:
for T=8192, V=152064 those are 5 GiB each.
"""

from __future__ import annotations

import torch

_SLAB_ELEMENTS = 1 << 24


@torch.no_grad()
def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    entropies = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    rows_per_slab = max(1, _SLAB_ELEMENTS // vocab)
    for start in range(0, flat.shape[0], rows_per_slab):
        logits_slab = flat[start:start + rows_per_slab]
        slab = logits_slab.to(torch.float32, copy=True)  # a copy: the in-place ops below must not touch the input
        log_partition = torch.logsumexp(slab, dim=-1)
        # H = log Z - sum_v p_v * z_v, with p = softmax(z); exp(z - log Z) reuses the slab's buffer.
        expected_logit = (slab.sub_(log_partition.unsqueeze(-1)).exp_() * logits_slab).sum(-1)
        entropies[start:start + rows_per_slab] = log_partition - expected_logit
    return entropies.reshape(logits.shape[:-1])
