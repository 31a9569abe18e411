"""`token_entropy`: full-vocabulary entropies in slabs, checked against a float64 reference."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import torch

from molt_flashreinforce import entropy as entropy_module
from molt_flashreinforce.entropy import token_entropy


def float64_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    log_p = torch.log_softmax(logits.double() / temperature, dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_slab_entropy_matches_a_float64_reference(monkeypatch, dtype, temperature):
    monkeypatch.setattr(entropy_module, "_SLAB_ELEMENTS", 1000 * 4)  # 4 positions a slab: 4 + 4 + 4 + 3
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 1000, generator=generator) * 4).to(dtype)
    logits[0, 0] = 0.0  # uniform: H = log V exactly
    logits[0, 1, 7] = 200.0  # one-hot in float32: H ~ 0
    before = logits.clone()
    ours = token_entropy(logits, temperature=temperature)
    assert ours.shape == (3, 5) and ours.dtype == torch.float32 and not ours.requires_grad
    reference = float64_entropy(logits, temperature)
    # H = log Z - E[z] cancels: float32 leaves an absolute error of a few ulps of max |z / T| (~30 here).
    torch.testing.assert_close(ours.double(), reference, rtol=1e-5, atol=1e-4)
    assert abs(ours[0, 0].item() - torch.log(torch.tensor(1000.0)).item()) < 1e-5
    assert torch.equal(logits, before)  # the input is read, never modified


def test_slab_boundaries_do_not_change_the_values(monkeypatch):
    logits = torch.randn(2, 9, 300).to(torch.bfloat16)
    whole = token_entropy(logits, temperature=0.8)
    monkeypatch.setattr(entropy_module, "_SLAB_ELEMENTS", 300 * 2)
    torch.testing.assert_close(token_entropy(logits, temperature=0.8), whole, rtol=1e-6, atol=1e-6)


_SHARDED_RANK = """
import sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from molt_flashreinforce import entropy
rank, port, inputs, outputs = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + port, rank=rank, world_size=2)
logits = torch.load(inputs)
entropy._SLAB_ELEMENTS = logits.shape[-1] * 3  # several slabs per row
sharded = distribute_tensor(logits, init_device_mesh("cpu", (2,)), [Shard(-1)])
assert sharded.to_local().shape[-1] == logits.shape[-1] // 2
torch.save(entropy.token_entropy(sharded, temperature=0.7), outputs)
# Without a barrier one rank can tear down its gloo pairs while the other still reads from them, and
# gloo then aborts the process at exit (about 1 run in 60 here; none in 270 with the barrier).
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_vocabulary_sharded_dtensor_is_gathered_slab_by_slab(tmp_path):
    """Tensor parallelism shards the logits' vocabulary across ranks: two gloo processes here."""
    logits = (torch.randn(2, 7, 64) * 3).to(torch.bfloat16)
    torch.save(logits, tmp_path / "logits.pt")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    ranks = [subprocess.Popen([sys.executable, "-c", _SHARDED_RANK, str(rank), port, str(tmp_path / "logits.pt"),
                               str(tmp_path / f"rank{rank}.pt")]) for rank in range(2)]
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    expected = token_entropy(logits, temperature=0.7)
    for rank in range(2):
        assert torch.equal(torch.load(tmp_path / f"rank{rank}.pt"), expected)
