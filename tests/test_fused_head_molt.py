"""The fused head inside Molt's own `PolicyTrainer.training_step`, against Molt's own head.

The same experience is trained once with `--flashreinforce.fused_head true` and once with false,
on Molt's real `Actor` around a tiny GPT-2 whose lm_head is tied to its token embedding (as
Qwen2.5-Math-1.5B's is), on the recipe and on each ablation: the log-probs the loss receives, the
loss and every parameter's gradient agree to 1e-5 in float32, and in bf16 by no more than Molt's
bf16 step differs from its own float32 step. Stood in for, as in tests/test_molt_worker.py: the
FSDP strategy (a local backward) and the GPU barrier; FSDP2 itself runs in tests/test_fused_head_fsdp.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from molt.trainer.fsdp.packing import pack_padded_batch

from molt_flashreinforce import metrics
from molt_flashreinforce.plugin import seams

# The Molt trainer set-up of tests/test_molt_worker.py (Molt's wheel owns the top-level name `tests`).
_spec = importlib.util.spec_from_file_location("molt_worker_setup", Path(__file__).with_name("test_molt_worker.py"))
_setup = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_setup)
build_trainer, make_experience, molt_args, tiny_actor, training_step = (
    _setup.build_trainer, _setup.make_experience, _setup.molt_args, _setup.tiny_actor, _setup.training_step)

ABLATIONS = {
    "recipe": (),
    "token_gate": ("--flashreinforce.gate_level", "token"),
    "geometric_gate": ("--flashreinforce.gate_mean", "geometric"),
    "token_mean": ("--flashreinforce.reduction", "token_mean"),
    "constant_length": ("--flashreinforce.reduction", "constant_length", "--flashreinforce.constant_length", "8"),
    "no_is": ("--flashreinforce.importance_sampling", "false"),
    "entropy_filter": ("--flashreinforce.entropy_filter_q", "0.5"),
}


def run_step(monkeypatch, tmp_path, fused, flags, dtype=torch.float32, temperature=1.0):
    """(log-probs the loss got, loss, bound entropies, every gradient) of one Molt training step."""
    torch.manual_seed(0)
    actor = tiny_actor(dtype, temperature)
    assert actor.model.lm_head.weight is actor.model.transformer.wte.weight  # tied embeddings
    args = molt_args(tmp_path, *flags, "--flashreinforce.fused_head", str(fused).lower())
    trainer, actor = build_trainer(monkeypatch, args, actor)
    torch.manual_seed(1)
    experience = make_experience(actor, torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0.0, 2.0, 0.01, 0.0]))
    loss_fn, seen = trainer.actor_loss_fn, {}
    forward = loss_fn.forward

    def recording(log_probs, *args, **kwargs):
        result = forward(log_probs, *args, **kwargs)
        seen.update(log_probs=log_probs.detach().float(), loss=result[0].detach().float(),
                    entropies=loss_fn.bound_entropies)
        return result

    loss_fn.forward = recording
    head_outputs = []
    actor.model.lm_head.register_forward_hook(lambda module, inputs, output: head_outputs.append(output.shape))
    status = training_step(trainer, experience)
    # The fused head's lm_head returned [B, S] log-probs, Molt's the [B, S, V] logits.
    assert head_outputs == [(4, 12)] if fused else head_outputs == [(4, 12, 32)]
    # What Molt logs as metrics.FUSED_HEAD for this micro-batch: per sample, which head scored it.
    assert status["metrics"][metrics.step_key(metrics.FUSED_HEAD)].tolist() == [float(fused)] * 4
    assert "forward" not in vars(actor) and "forward" not in vars(actor.model.lm_head)  # nothing left installed
    return seen, [p.grad.float().clone() for p in actor.parameters()]


@pytest.mark.parametrize("ablation", ABLATIONS)
def test_float32_step_equals_molts_head(monkeypatch, tmp_path, ablation):
    temperature = 0.7 if ablation == "entropy_filter" else 1.0
    (fused, fused_grads), (stock, stock_grads) = (
        run_step(monkeypatch, tmp_path, flag, ABLATIONS[ablation], temperature=temperature) for flag in (True, False))
    torch.testing.assert_close(fused["log_probs"], stock["log_probs"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused["loss"], stock["loss"], rtol=1e-5, atol=1e-7)
    assert fused["loss"] != 0
    for ours, theirs in zip(fused_grads, stock_grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)
    if ablation == "entropy_filter":
        assert not fused["entropies"].requires_grad
        torch.testing.assert_close(fused["entropies"], stock["entropies"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ablation", ["recipe", "entropy_filter"])
def test_bfloat16_step_is_within_molts_own_bfloat16_spread(monkeypatch, tmp_path, ablation):
    flags = ABLATIONS[ablation]
    fused, fused_grads = run_step(monkeypatch, tmp_path, True, flags, torch.bfloat16)
    stock, stock_grads = run_step(monkeypatch, tmp_path, False, flags, torch.bfloat16)
    exact, exact_grads = run_step(monkeypatch, tmp_path, False, flags, torch.float32)

    def within(ours, theirs, reference, what):
        spread = (theirs - reference).abs().max()
        assert (ours - theirs).abs().max() <= spread + 1e-6, what

    within(fused["log_probs"], stock["log_probs"], exact["log_probs"], "log-probs")
    within(fused["loss"], stock["loss"], exact["loss"], "loss")
    for index, grads in enumerate(zip(fused_grads, stock_grads, exact_grads, strict=True)):
        within(*grads, f"gradient {index}")


def test_packed_targets_are_molts_packed_labels():
    """Under --fsdp.packing_samples Molt feeds the model real tokens only (HF packing needs
    flash-attention, absent here): the targets are those `pack_padded_batch` returns, padded as it pads."""
    sequences = torch.randint(1, 50, (3, 7))
    attention_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0, 0]])
    for pad_to in (None, 20):
        _, _, rolled, _, _ = pack_padded_batch(sequences, attention_mask, pad_to_tokens=pad_to)
        targets_for = seams.fused_head_targets(sequences, attention_mask, packed=True)
        assert torch.equal(targets_for(rolled.shape), rolled)
    assert torch.equal(seams.fused_head_targets(sequences, attention_mask, packed=False)(sequences.shape),
                       torch.roll(sequences, -1, 1))


def test_refused_in_one_line_where_it_cannot_apply(monkeypatch, tmp_path):
    for flags, message in ((("--actor.entropy_coef", "0.01"), "actor.entropy_coef=0.01 trains through them"),
                           (("--fsdp.tp_size", "2"), r"vocabulary-parallel lm_head \(fsdp.tp_size=2\)")):
        with pytest.raises(ValueError, match=message + ".*set algo.fused_head=false"):
            build_trainer(monkeypatch, molt_args(tmp_path, *flags))
