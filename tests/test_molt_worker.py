"""The plugin inside Molt's own `PolicyTrainer`, the object each `PolicyModelActor` owns.

Molt's real `PolicyTrainer.__init__` and `training_step` run here, on arguments produced by Molt's
own parser and validation, and so does Molt's real `Actor.forward` around a pre-built tiny GPT-2
(the path Molt takes for an already-instantiated model). Two things cannot exist on this CPU
machine and are stood in for: AutoModel's FSDP wrapping of that model (needs nemo_automodel and a
GPU), and the strategy's distributed backward/step (FSDP collectives), replaced by plain local
autograd and an optimizer step; the GPU barrier in `__init__` is a no-op.
"""

from __future__ import annotations

from contextlib import ExitStack
from types import SimpleNamespace

import pytest
import torch
from molt.models import actor as molt_actor
from molt.models.base import _AttrDict
from molt.trainer.algorithm.experience import Experience
from molt.trainer.workers import policy_actor
from transformers import GPT2Config, GPT2LMHeadModel

from molt_flashreinforce import entropy as entropy_module
from molt_flashreinforce import metrics
from molt_flashreinforce.entropy import token_entropy
from molt_flashreinforce.launch.molt_cli import parse_and_validate
from molt_flashreinforce.objective import FlashReinforceConfig, _entropy_filter_keep, flashreinforce_loss
from molt_flashreinforce.plugin import register
from molt_flashreinforce.plugin.policy_loss import FlashReinforcePolicyLoss

torch.manual_seed(0)


def tiny_actor(dtype=torch.float32, temperature=1.0):
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).to(dtype)
    return molt_actor.Actor(model, temperature=temperature)


class LocalStrategy:
    """Stand-in for Molt's FSDP strategy: local backward and optimizer step (no collectives)."""

    dp_size = 1

    def __init__(self, args):
        self.args = args

    def backward(self, loss, model, optimizer, **_):
        loss.backward()

    def optimizer_step(self, optimizer, model, scheduler, **_):
        pass  # keep .grad for the assertions

    def get_grad_norm(self, model):
        return torch.tensor(0.0)


def molt_args(tmp_path, *extra):
    agent = tmp_path / "agent.py"
    agent.write_text("")
    return parse_and_validate([
        "--actor.model_name_or_path", "tiny", "--train.agent_path", str(agent),
        "--algo.advantage.estimator", "flashreinforce", "--actor.loss_mode", "flashreinforce",
        "--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_gating", "binary_kl",
        "--algo.advantage.is_correction_threshold", "0.003", "--actor.loss_agg_mode", "seq-mean-token-mean",
        "--train.force_on_policy", "--rollout.n_samples_per_prompt", "1", "--flashreinforce.delta", "0.003",
        "--vllm.num_engines", "1",
        *extra,
    ])


def build_trainer(monkeypatch, args, actor=None):
    register()
    monkeypatch.setattr(policy_actor, "torch_dist_barrier_and_cuda_sync", lambda: None)  # GPU barrier
    actor = actor or tiny_actor()
    optimizer = torch.optim.SGD(actor.parameters(), lr=0.0)
    scheduler = SimpleNamespace(get_last_lr=lambda: [0.0])
    return policy_actor.PolicyTrainer(LocalStrategy(args), actor, optimizer, scheduler, vllm_engines=None), actor


def make_experience(actor, rewards, drift):
    batch, length, actions = len(rewards), 12, 8
    sequences = torch.randint(0, 32, (batch, length))
    action_mask = torch.zeros(batch, actions, dtype=torch.bool)
    for row, tokens in enumerate([8, 5, 3, 6][:batch]):
        action_mask[row, :tokens] = True
    with torch.no_grad():
        current = actor(sequences, action_mask)["log_probs"][:, -actions:]
    rollout = torch.where(action_mask, current - drift.unsqueeze(-1), 0.0)
    advantages = (rewards - rewards.mean()).unsqueeze(-1) * action_mask
    return Experience(sequences=sequences, attention_mask=torch.ones(batch, length, dtype=torch.long),
                      action_mask=action_mask, rollout_log_probs=rollout, advantages=advantages,
                      info={"reward": rewards.clone()})


def test_policy_trainer_builds_our_loss_from_molts_parsed_arguments(monkeypatch, tmp_path):
    args = molt_args(tmp_path, "--flashreinforce.gate_level", "token", "--flashreinforce.reduction", "token_mean")
    trainer, _ = build_trainer(monkeypatch, args)
    assert isinstance(trainer.actor_loss_fn, FlashReinforcePolicyLoss)
    assert trainer.actor_loss_fn.config == FlashReinforceConfig(delta=0.003, gate_level="token", reduction="token_mean")


def test_stock_loss_modes_are_left_to_molt(monkeypatch, tmp_path):
    args = molt_args(tmp_path)
    args.actor.loss_mode = "ppo"
    trainer, actor = build_trainer(monkeypatch, args)
    assert type(trainer.actor_loss_fn) is policy_actor.PolicyLoss
    status = training_step(trainer, make_experience(actor, torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4)))
    assert metrics.step_key(metrics.FUSED_HEAD) not in status["metrics"]  # Molt's own head, nothing of ours logged


class EntropyWorkSpy:
    """Counts, during a training step, the model forwards, the `return_entropy` Molt's
    `Actor.forward` was asked for, and the calls of Molt's one-shot `compute_entropy`."""

    def __init__(self, monkeypatch, actor):
        self.model_forwards, self.return_entropy, self.molt_compute_entropy = 0, [], 0
        actor.model.register_forward_hook(self._count_forward)
        forward, compute_entropy = molt_actor.Actor.forward, molt_actor.compute_entropy

        def recording_forward(actor_self, *args, return_entropy=False, **kwargs):
            self.return_entropy.append(return_entropy)
            return forward(actor_self, *args, return_entropy=return_entropy, **kwargs)

        def counting_compute_entropy(logits):
            self.molt_compute_entropy += 1
            return compute_entropy(logits)

        monkeypatch.setattr(molt_actor.Actor, "forward", recording_forward)
        monkeypatch.setattr(molt_actor, "compute_entropy", counting_compute_entropy)

    def _count_forward(self, *_):
        self.model_forwards += 1


def training_step(trainer, experience):
    return trainer.training_step(experience, kl_ctl=0.0, batch_num_tokens=experience.action_mask.sum(),
                                 num_microbatches=1, is_optimizer_step=True,
                                 batch_num_seqs=torch.tensor(experience.action_mask.shape[0]))


@pytest.mark.parametrize("q", [1.0, 0.5])
def test_molts_training_step_runs_the_full_objective(monkeypatch, tmp_path, q):
    # Molt's own head (the fused head's parity with it: tests/test_fused_head_molt.py).
    args = molt_args(tmp_path, "--flashreinforce.entropy_filter_q", str(q), "--flashreinforce.fused_head", "false")
    trainer, actor = build_trainer(monkeypatch, args)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    drift = torch.tensor([0.0, 2.0, 0.01, 0.0])  # row 1 is far off-policy and must be rejected
    experience = make_experience(actor, rewards, drift)

    spy = EntropyWorkSpy(monkeypatch, actor)
    status = training_step(trainer, experience)
    molt_grads = [p.grad.clone() for p in actor.parameters()]
    # One forward, never with Molt's entropy path (its float32 logits copy and one-shot entropy).
    assert (spy.model_forwards, spy.return_entropy, spy.molt_compute_entropy) == (1, [False], 0)

    # The same step computed directly with the pure objective.
    actor.zero_grad()
    output = actor(experience.sequences, experience.action_mask)
    mask = experience.action_mask
    entropies = token_entropy(output["logits"])[:, :-1][:, -mask.shape[1]:]
    out = flashreinforce_loss(output["action_log_probs"], experience.rollout_log_probs, rewards, mask,
                              FlashReinforceConfig(delta=0.003, entropy_filter_q=q),
                              failures=rewards <= 0, entropies=entropies)
    out.loss.backward()
    for molt_grad, parameter in zip(molt_grads, actor.parameters()):
        torch.testing.assert_close(molt_grad, parameter.grad, rtol=1e-5, atol=1e-7)

    assert out.stats.admitted.tolist() == [True, False, True, True]
    metrics = status["metrics"]
    assert metrics["flashreinforce/acceptance_rate"].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert metrics["is_filter_ratio"].tolist() == [0.0, 1.0, 0.0, 0.0]
    if q < 1:
        assert metrics["flashreinforce/retained_token_fraction"][2].item() < 1.0  # a failed row was filtered
    # Nothing is left bound or swapped after the step.
    assert "forward" not in vars(actor) and "_forward_backbone" not in vars(actor)
    assert trainer.actor_loss_fn.bound_experience is None and trainer.actor_loss_fn.bound_entropies is None


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_filter_picks_the_tokens_molts_float32_entropy_path_picks(monkeypatch, tmp_path, temperature):
    """bf16 logits, several slabs: the entropies match those of Molt's own entropy path, which
    upcasts the whole logits to float32, scales them by the temperature and runs its one-shot
    `compute_entropy` (the previous plugin path took its entropies from that float32 copy), and
    the filter keeps exactly the same tokens."""
    monkeypatch.setattr(entropy_module, "_SLAB_ELEMENTS", 32 * 5)  # 5 positions a slab, 12 per row
    args = molt_args(tmp_path, "--flashreinforce.entropy_filter_q", "0.5", "--flashreinforce.fused_head", "false")
    trainer, actor = build_trainer(monkeypatch, args, tiny_actor(torch.bfloat16, temperature))
    with torch.no_grad():
        actor.model.lm_head.weight.mul_(30)  # spread the logits: far from uniform, entropies far from tied
    rewards = torch.tensor([0.0, 1.0, 0.0, 0.0])
    experience = make_experience(actor, rewards, torch.zeros(4))
    loss_fn, captured = trainer.actor_loss_fn, []
    loss_forward = type(loss_fn).forward
    monkeypatch.setattr(type(loss_fn), "forward",
                        lambda self, *a, **k: captured.append(self.bound_entropies) or loss_forward(self, *a, **k))
    training_step(trainer, experience)
    ours = captured[0]

    mask = experience.action_mask
    with torch.no_grad():
        molt_output = actor(experience.sequences, mask, return_entropy=True)
    assert molt_output["logits"].dtype == torch.float32  # Molt's path: the whole float32 copy
    molt_entropies = molt_output["entropy"][:, -mask.shape[1]:]
    assert ours.dtype == torch.float32 and not ours.requires_grad
    torch.testing.assert_close(ours, molt_entropies, rtol=1e-5, atol=1e-5)
    if temperature != 1.0:  # the rollout temperature was applied, not T = 1
        unscaled = token_entropy(molt_output["logits"])[:, :-1][:, -mask.shape[1]:]
        assert (ours - unscaled).abs().max() > 1e-2

    failures, tokens = rewards <= 0, mask.sum(-1)
    keep_ours = _entropy_filter_keep(mask, failures, ours, 0.5, tokens)
    assert torch.equal(keep_ours, _entropy_filter_keep(mask, failures, molt_entropies, 0.5, tokens))
    assert keep_ours.sum() < mask.sum()  # the filter dropped tokens


def test_entropy_bonus_keeps_molts_differentiable_entropy(monkeypatch, tmp_path):
    args = molt_args(tmp_path, "--flashreinforce.entropy_filter_q", "0.5", "--actor.entropy_coef", "0.01",
                     "--flashreinforce.fused_head", "false")
    trainer, actor = build_trainer(monkeypatch, args)
    experience = make_experience(actor, torch.tensor([1.0, 0.0]), torch.zeros(2))
    spy = EntropyWorkSpy(monkeypatch, actor)
    training_step(trainer, experience)
    assert (spy.model_forwards, spy.return_entropy, spy.molt_compute_entropy) == (1, [True], 1)


def test_token_entropy_matches_molts_compute_entropy_without_a_graph():
    logits = torch.randn(3, 5, 1000, requires_grad=True) * 4
    ours = token_entropy(logits)
    torch.testing.assert_close(ours, molt_actor.compute_entropy(logits.detach()), rtol=1e-5, atol=1e-5)
    assert not ours.requires_grad
    bf16 = logits.detach().to(torch.bfloat16)
    before = bf16.clone()
    torch.testing.assert_close(token_entropy(bf16), molt_actor.compute_entropy(bf16.float()), rtol=1e-4, atol=1e-4)
    assert torch.equal(bf16, before)  # the input is never modified in place
