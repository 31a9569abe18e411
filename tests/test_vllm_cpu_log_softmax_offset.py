"""vLLM's CPU sampler returns the log-probs of a sharp distribution over a large vocabulary a little
too high, by more the lower the top token's id; Molt's trainer does not (experiments/benchmarks.md,
"vLLM's engine against the trainer", where this is the float32 engine's one-signed offset).

The sampler (`TopKTopPSampler.forward_cpu` with `logprobs_mode="processed_logprobs"`, vLLM 0.32.0)
returns `logits.log_softmax(dim=-1, dtype=torch.float32)`. PyTorch's CPU kernel for it sums
exp(x - max) along the row in one float32 vector accumulator, so the lane that holds the top
token's exp(0) = 1 rounds away the tail terms added to it after that token: the normalizer comes
out too small and every log-prob too high. With the top token last in the row nothing is added
after it and the offset goes, so it is the summation order, not a token the engine leaves out of
the normalizer. Molt's `log_probs_from_logits` takes a logsumexp and agrees with float64.

No engine is started: the sampler function runs on one row of Qwen2.5's vocabulary size whose top
token has probability 0.96, the benchmark's mean sampled-token probability.
"""

from __future__ import annotations

import pytest
import torch

from molt_flashreinforce.evaluation.engine import vllm_version

pytestmark = [
    pytest.mark.slow,  # importing vLLM's sampler takes several seconds
    pytest.mark.skipif(vllm_version() is None, reason="vLLM's CPU build is not installed (scripts/setup_vllm.sh)"),
]

VOCAB = 151_936  # Qwen2.5's padded vocabulary, the math experiment's
OFFSET = 2e-5  # the top token first: measured 6e-5 with 16 float32 lanes, more with fewer lanes
EXACT = 2e-6  # float32 rounding of a logsumexp, or of the kernel with nothing after the top token


def sharp_row() -> torch.Tensor:
    """Logit 0 for token 0, the other ids N(-17, 2): token 0 has probability 0.956."""
    row = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0)) * 2 - 17
    row[0] = 0.0
    return row


def vllm_cpu_log_probs(row: torch.Tensor) -> torch.Tensor:
    from vllm.platforms import current_platform
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    current_platform.import_kernels()  # the sampler's Gumbel-max op
    sampler = TopKTopPSampler(logprobs_mode="processed_logprobs")
    assert sampler.forward == sampler.forward_cpu
    _, log_probs = sampler(row[None].clone(), {}, None, None)  # no generators, no top-k, no top-p
    return log_probs[0]


def test_vllm_cpu_sampler_puts_a_sharp_rows_log_probs_above_float64_and_molts_trainer():
    from molt.models.utils import log_probs_from_logits

    row = sharp_row()
    reference = row.double().log_softmax(-1)
    assert reference[0].exp().item() == pytest.approx(0.956, abs=1e-3)
    engine = vllm_cpu_log_probs(row).double()
    assert engine[0] - reference[0] > OFFSET, "vLLM's CPU log-probs now normalise: the benchmark note is stale"
    assert engine.logsumexp(-1).item() > OFFSET  # the returned distribution sums to more than 1
    trainer = log_probs_from_logits(row[None], torch.tensor([0]), 1.0)[0].double()
    assert abs(trainer - reference[0]).item() < EXACT


def test_the_offset_goes_with_the_top_token_last_in_the_row():
    row = sharp_row()
    row[[0, -1]] = row[[-1, 0]]
    reference = row.double().log_softmax(-1)
    assert abs(vllm_cpu_log_probs(row).double()[-1] - reference[-1]).item() < EXACT
