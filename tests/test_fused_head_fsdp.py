"""The fused head under FSDP2: two gloo ranks on CPU, each running Molt's real
`PolicyTrainer.training_step` on its own micro-batch with a tiny Qwen2 wrapped by `fully_shard`
(each decoder layer, the lm_head when it is not tied, then the root), once with the fused head and
once with Molt's head. With tied embeddings the head's weight is the root's embedding; untied, the
lm_head is its own sharded module. The log-probs, losses and every gathered gradient agree to 1e-5.
A vocabulary-sharded weight (tensor parallelism) is refused in one line. Stood in for: Molt's FSDP
strategy object (a local backward; FSDP2's own hooks still gather, reduce-scatter and average).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_RANK = """
import importlib.util, sys
import pytest, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from molt.models.actor import Actor
from transformers import Qwen2Config, Qwen2ForCausalLM
from molt_flashreinforce.fused_head import head_computing_log_probs

rank, port, setup_file, out, tied, work = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "tied", sys.argv[6]
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + port, rank=rank, world_size=2)
spec = importlib.util.spec_from_file_location("molt_worker_setup", setup_file)
setup = importlib.util.module_from_spec(spec)
spec.loader.exec_module(setup)
from pathlib import Path

results = {}
for fused in (True, False):
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied,
                                         attn_implementation="eager"))
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    for layer in model.model.layers:
        fully_shard(layer)
    if not tied:
        fully_shard(model.lm_head)
    fully_shard(model)
    assert isinstance(model.lm_head.weight, DTensor) and model.lm_head.weight.to_local().shape[0] == 16
    monkeypatch = pytest.MonkeyPatch()
    args = setup.molt_args(Path(work), "--flashreinforce.entropy_filter_q", "0.5",
                           "--flashreinforce.fused_head", "true" if fused else "false")
    trainer, actor = setup.build_trainer(monkeypatch, args, Actor(model, temperature=0.7))
    torch.manual_seed(1 + rank)  # each rank its own micro-batch
    experience = setup.make_experience(actor, torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0.0, 2.0, 0.01, 0.0]))
    loss_fn, seen = trainer.actor_loss_fn, {}
    forward = loss_fn.forward

    def recording(log_probs, *a, **k):
        result = forward(log_probs, *a, **k)
        seen.update(log_probs=log_probs.detach(), loss=result[0].detach(), entropies=loss_fn.bound_entropies)
        return result

    loss_fn.forward = recording
    setup.training_step(trainer, experience)
    seen["grads"] = [p.grad.full_tensor() for p in model.parameters()]
    results[fused] = seen
    monkeypatch.undo()

# A vocabulary-sharded weight (what tensor parallelism gives the head) is refused in one line.
linear = torch.nn.Linear(16, 32, bias=False)
linear.weight = torch.nn.Parameter(distribute_tensor(linear.weight.detach(), init_device_mesh("cpu", (2,)), [Shard(0)]))
try:
    with head_computing_log_probs(linear, lambda tokens: torch.zeros(tokens, dtype=torch.long), 1.0, False):
        linear(torch.randn(2, 16))
    results["tp_refusal"] = None
except ValueError as error:
    results["tp_refusal"] = str(error)
torch.save(results, out)
dist.barrier()  # see tests/test_entropy.py: no rank tears down gloo while the other still reads
dist.destroy_process_group()
"""


def free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


@pytest.mark.slow
@pytest.mark.parametrize("embeddings", ["tied", "untied"])
def test_fused_head_under_fsdp2_equals_molts_head(tmp_path, embeddings):
    setup_file = Path(__file__).with_name("test_molt_worker.py")
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, "-c", _RANK, str(rank), port, str(setup_file),
                               str(tmp_path / f"rank{rank}.pt"), embeddings, str(tmp_path)]) for rank in range(2)]
    assert [rank.wait(timeout=300) for rank in ranks] == [0, 0]
    per_rank = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    for results in per_rank:
        fused, stock = results[True], results[False]
        torch.testing.assert_close(fused["log_probs"], stock["log_probs"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fused["loss"], stock["loss"], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(fused["entropies"], stock["entropies"], rtol=1e-5, atol=1e-5)
        for ours, theirs in zip(fused["grads"], stock["grads"], strict=True):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)
        assert "vocabulary-parallel" in results["tp_refusal"] and "\n" not in results["tp_refusal"]
    # The ranks trained different micro-batches and FSDP averaged their gradients.
    assert not torch.equal(per_rank[0][True]["log_probs"], per_rank[1][True]["log_probs"])
    for first, second in zip(per_rank[0][True]["grads"], per_rank[1][True]["grads"], strict=True):
        torch.testing.assert_close(first, second)
