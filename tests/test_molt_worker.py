"""The plugin inside Molt's own `PolicyTrainer`, the object each `PolicyModelActor` owns.

Molt's real `PolicyTrainer.__init__` and `training_step` run here, on arguments produced by Molt's
own parser and validation. Two things cannot exist on this CPU machine and are stood in for:
the FSDP/AutoModel `Actor` (needs nemo_automodel and a GPU) is replaced by a tiny transformers
model that honours `Actor.forward`'s contract, and the strategy's distributed backward/step
(FSDP collectives) by plain local autograd and an optimizer step; the GPU barrier in `__init__`
is a no-op.
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

from molt_flashreinforce.entropy import token_entropy
from molt_flashreinforce.launch.molt_cli import parse_and_validate
from molt_flashreinforce.objective import FlashReinforceConfig, flashreinforce_loss
from molt_flashreinforce.plugin import register
from molt_flashreinforce.plugin.policy_loss import FlashReinforcePolicyLoss

torch.manual_seed(0)


class TinyActor(torch.nn.Module):
    """Stand-in for Molt's FSDP `Actor`: same call signature and output keys, on a 2-layer GPT-2."""

    def __init__(self):
        super().__init__()
        self.model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
        self.entropy_calls = []

    def forward(self, sequences, action_mask=None, attention_mask=None, cp_context_stack=None,
                return_entropy=False, routed_experts=None, top_ids=None, **_):
        logits = self.model(sequences, attention_mask=attention_mask).logits.float()
        output = _AttrDict(logits=logits)
        if return_entropy:
            # Looked up on Molt's module at call time, exactly like the real Actor.forward.
            self.entropy_calls.append(molt_actor.compute_entropy)
            output["entropy"] = molt_actor.compute_entropy(logits)[:, :-1]
        log_probs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, sequences[:, 1:].unsqueeze(-1)).squeeze(-1)
        output["log_probs"] = log_probs
        output["action_log_probs"] = log_probs[:, -action_mask.shape[1]:] * action_mask.float()
        return output


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


def build_trainer(monkeypatch, args):
    register()
    monkeypatch.setattr(policy_actor, "torch_dist_barrier_and_cuda_sync", lambda: None)  # GPU barrier
    actor = TinyActor()
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
    trainer, _ = build_trainer(monkeypatch, args)
    assert type(trainer.actor_loss_fn) is policy_actor.PolicyLoss


@pytest.mark.parametrize("q", [1.0, 0.5])
def test_molts_training_step_runs_the_full_objective(monkeypatch, tmp_path, q):
    args = molt_args(tmp_path, "--flashreinforce.entropy_filter_q", str(q))
    trainer, actor = build_trainer(monkeypatch, args)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    drift = torch.tensor([0.0, 2.0, 0.01, 0.0])  # row 1 is far off-policy and must be rejected
    experience = make_experience(actor, rewards, drift)

    status = trainer.training_step(experience, kl_ctl=0.0, batch_num_tokens=experience.action_mask.sum(),
                                   num_microbatches=1, is_optimizer_step=True,
                                   batch_num_seqs=torch.tensor(4))
    molt_grads = [p.grad.clone() for p in actor.parameters()]
    entropy_calls_in_step = list(actor.entropy_calls)

    # The same step computed directly with the pure objective.
    actor.zero_grad()
    output = actor(experience.sequences, experience.action_mask, return_entropy=True)
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
    if q == 1:
        assert entropy_calls_in_step == []  # no entropy pass without the filter
    else:
        # The forward ran with entropies on, through the chunked, graph-free implementation.
        assert entropy_calls_in_step == [token_entropy]
        assert metrics["flashreinforce/retained_token_fraction"][2].item() < 1.0  # a failed row was filtered
    # Nothing is left bound or swapped after the step.
    assert molt_actor.compute_entropy is not token_entropy
    assert "forward" not in vars(actor)
    assert trainer.actor_loss_fn.bound_experience is None and trainer.actor_loss_fn.bound_entropies is None


def test_entropy_bonus_keeps_molts_differentiable_entropy(monkeypatch, tmp_path):
    args = molt_args(tmp_path, "--flashreinforce.entropy_filter_q", "0.5", "--actor.entropy_coef", "0.01")
    trainer, actor = build_trainer(monkeypatch, args)
    experience = make_experience(actor, torch.tensor([1.0, 0.0]), torch.zeros(2))
    trainer.training_step(experience, kl_ctl=0.0, batch_num_tokens=experience.action_mask.sum(),
                          num_microbatches=1, is_optimizer_step=True, batch_num_seqs=torch.tensor(2))
    assert actor.entropy_calls and all(call is not token_entropy for call in actor.entropy_calls)


def test_token_entropy_matches_molts_compute_entropy_without_a_graph():
    logits = torch.randn(3, 5, 1000, requires_grad=True) * 4
    ours = token_entropy(logits)
    torch.testing.assert_close(ours, molt_actor.compute_entropy(logits.detach()), rtol=1e-5, atol=1e-5)
    assert not ours.requires_grad
    bf16 = logits.detach().to(torch.bfloat16)
    before = bf16.clone()
    torch.testing.assert_close(token_entropy(bf16), molt_actor.compute_entropy(bf16.float()), rtol=1e-4, atol=1e-4)
    assert torch.equal(bf16, before)  # the input is never modified in place
