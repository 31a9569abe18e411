"""The chunked head against Molt's own stock computation: `F.linear` logits, then Molt's
`log_probs_from_logits` (float32 upcast, temperature) and `compute_entropy`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from molt.models.utils import compute_entropy, log_probs_from_logits

from molt_flashreinforce.fused_head import chunked_log_probs, head_computing_log_probs


def inputs(dtype, tokens=(3, 11), hidden=16, vocab=97, seed=0):
    generator = torch.Generator().manual_seed(seed)
    h = (torch.randn(*tokens, hidden, generator=generator) * 0.5).to(dtype).requires_grad_()
    w = torch.randn(vocab, hidden, generator=generator).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, tokens, generator=generator)
    upstream = torch.randn(*tokens, generator=generator)
    return h, w, targets, upstream


def stock(h, w, targets, upstream, temperature):
    logits = F.linear(h, w)
    log_probs = log_probs_from_logits(logits, targets, temperature=temperature)
    entropy = compute_entropy(logits.detach().float() / temperature)
    grad_h, grad_w = torch.autograd.grad((log_probs * upstream).sum(), (h, w))
    return log_probs.detach(), entropy, grad_h, grad_w


def fused(h, w, targets, upstream, temperature, chunk_elements):
    log_probs, entropy = chunked_log_probs(h, w, targets, temperature, with_entropy=True, chunk_elements=chunk_elements)
    assert not entropy.requires_grad and log_probs.dtype == entropy.dtype == torch.float32
    grad_h, grad_w = torch.autograd.grad((log_probs * upstream).sum(), (h, w))
    return log_probs.detach(), entropy, grad_h, grad_w


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_elements", [97 * 4, 97 * 33, 1 << 24])  # several chunks, one ragged, one chunk
def test_float32_equals_molts_stock_head(temperature, chunk_elements):
    h, w, targets, upstream = inputs(torch.float32)
    ours, theirs = fused(h, w, targets, upstream, temperature, chunk_elements), stock(h, w, targets, upstream,
                                                                                       temperature)
    for name, a, b in zip(("log-probs", "entropy", "grad hidden", "grad weight"), ours, theirs):
        assert a.dtype == b.dtype, name
        if name == "entropy":
            # Molt's log Z - E[z] cancels and ours sums -p log p: each is within a few float32 ulps
            # of max |z| (about 10 here) of the float64 value.
            exact = compute_entropy(F.linear(h.double(), w.double()) / temperature)
            for entropy in (a, b):
                torch.testing.assert_close(entropy.double(), exact, rtol=1e-5, atol=1e-5)
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_bfloat16_stays_within_molts_own_bfloat16_error():
    """In bf16 the fused head may differ from Molt's bf16 path, but by no more than Molt's bf16 path
    differs from its own float32 path on the same (bf16-representable) inputs."""
    h, w, targets, upstream = inputs(torch.bfloat16, tokens=(4, 64), hidden=32, vocab=211)
    h32, w32 = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    exact = stock(h32, w32, targets, upstream, 0.8)
    molt_bf16 = stock(h, w, targets, upstream, 0.8)
    ours = fused(h, w, targets, upstream, 0.8, 211 * 20)
    for name, a, b, reference in zip(("log-probs", "entropy", "grad hidden", "grad weight"), ours, molt_bf16, exact):
        assert a.dtype == b.dtype, name
        spread = (b.float() - reference).abs().max()
        assert (a.float() - b.float()).abs().max() <= spread + 1e-6, name


def test_installed_head_returns_log_probs_and_restores_the_module():
    h, w, targets, _ = inputs(torch.float32)
    linear = torch.nn.Linear(16, 97, bias=False)
    with torch.no_grad():
        linear.weight.copy_(w)
    with head_computing_log_probs(linear, lambda tokens: targets, 0.7, with_entropy=False) as call:
        log_probs = linear(h)
    assert call.entropy is None and call.targets is targets
    torch.testing.assert_close(log_probs, log_probs_from_logits(F.linear(h, w), targets, temperature=0.7))
    assert linear(h).shape == (3, 11, 97)  # the plain linear again


def test_refusals():
    h, w, targets, _ = inputs(torch.float32)
    with pytest.raises(ValueError, match="targets have shape"):
        chunked_log_probs(h, w, targets[:, :-1])
    with pytest.raises(ValueError, match="without bias"):
        with head_computing_log_probs(torch.nn.Linear(16, 97), lambda tokens: targets, 1.0, False):
            pass
