"""`register()`: make `flashreinforce` a Molt advantage estimator and policy loss in this process.

Idempotent. It checks the Molt version, registers both names in Molt's own registries, and
patches Molt's `PolicyTrainer` (the loss owner inside each `PolicyModelActor`) so that
`--actor.loss_mode flashreinforce` builds `FlashReinforcePolicyLoss` and feeds it what Molt's
surrogate signature cannot carry: the micro-batch's rewards (failure labels) and, for the
entropy filter, the per-token entropies of the same forward pass, computed in slabs from the
logits that forward already holds (no float32 copy of them, no second forward).
"""

from __future__ import annotations

import functools
from contextlib import contextmanager

ESTIMATOR_NAME = "flashreinforce"
_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    from molt_flashreinforce.plugin.compat import check_molt_version

    check_molt_version()
    from molt.models.loss import register_policy_loss
    from molt.trainer.algorithm.advantage import register_advantage_estimator

    from molt_flashreinforce.plugin.estimator import flashreinforce_estimator
    from molt_flashreinforce.plugin.policy_loss import LOSS_NAME, flashreinforce_surrogate

    register_advantage_estimator(ESTIMATOR_NAME)(flashreinforce_estimator)
    _count_each_trajectory_once()
    register_policy_loss(LOSS_NAME)(flashreinforce_surrogate)
    _patch_policy_trainer()
    _registered = True


def _count_each_trajectory_once() -> None:
    """Make Molt merge a rollout's step-samples into one reward before our estimator runs.

    Molt gives only its group estimators (`GROUP_ADVANTAGE_ESTIMATORS`) one reward per rollout;
    any other estimator sees one reward per sample, so an agent that splits a trajectory into
    several samples would weigh it several times in the batch-mean baseline. Both modules hold
    the set (experience_maker imports it by name)."""
    from molt.trainer.algorithm import advantage
    from molt.trainer.rollout import experience_maker

    merged = advantage.GROUP_ADVANTAGE_ESTIMATORS | {ESTIMATOR_NAME}
    advantage.GROUP_ADVANTAGE_ESTIMATORS = experience_maker.GROUP_ADVANTAGE_ESTIMATORS = merged


def _patch_policy_trainer() -> None:
    from molt.trainer.workers import policy_actor

    from molt_flashreinforce.plugin.policy_loss import LOSS_NAME, FlashReinforcePolicyLoss, policy_loss_from_args

    trainer_cls = policy_actor.PolicyTrainer
    if getattr(trainer_cls, "_flashreinforce_patched", False):
        return
    original_init, original_step = trainer_cls.__init__, trainer_cls.training_step

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if self.args.actor.loss_mode == LOSS_NAME:
            self.actor_loss_fn = policy_loss_from_args(self.args)

    @functools.wraps(original_step)
    def training_step(self, experience, *args, **kwargs):
        loss_fn = self.actor_loss_fn
        if not isinstance(loss_fn, FlashReinforcePolicyLoss):
            return original_step(self, experience, *args, **kwargs)
        loss_fn.bound_experience = experience
        try:
            if loss_fn.config.uses_entropy_filter:
                with _capturing_action_entropies(self, loss_fn, experience.action_mask.shape[1]):
                    return original_step(self, experience, *args, **kwargs)
            return original_step(self, experience, *args, **kwargs)
        finally:
            loss_fn.bound_experience = None
            loss_fn.bound_entropies = None

    trainer_cls.__init__ = __init__
    trainer_cls.training_step = training_step
    trainer_cls._flashreinforce_patched = True


@contextmanager
def _capturing_action_entropies(trainer, loss_fn, num_actions: int):
    """Hand the loss the action span's entropies from the trainer's one actor forward.

    With an entropy bonus (entropy_coef > 0) Molt computes a differentiable entropy anyway, and
    the loss reads it. Without one, the forward runs as at q = 1 (no `return_entropy`, so Molt
    makes no float32 copy of the logits and keeps scoring the bf16 ones), and `token_entropy`
    computes the entropies afterwards from the logits that forward returns, slab by slab, at the
    actor's (rollout) temperature. `_forward_backbone` is observed, not changed, for the layout
    (context-parallel shard or packing) that maps them back onto the [B, S] axis, as in Molt.
    """
    from molt_flashreinforce.entropy import token_entropy

    actor = trainer.actor
    forward = type(actor).forward
    if trainer.args.actor.entropy_coef:
        def forward_with_entropy(*args, **kwargs):
            output = forward(actor, *args, **kwargs)
            loss_fn.bound_entropies = output["entropy"][:, -num_actions:].detach()
            return output
    else:
        backbone = actor._forward_backbone
        layouts = []

        def backbone_observed(*args, **kwargs):
            result = backbone(*args, **kwargs)
            layouts.append(result[2:])  # cp_forward, indices, batch, seqlen
            return result

        def forward_with_entropy(*args, **kwargs):
            output = forward(actor, *args, **kwargs)
            cp_forward, indices, batch, seqlen = layouts.pop()
            entropy = token_entropy(output["logits"], temperature=actor.temperature)
            entropy = actor._restore_full_sequence(entropy, cp_forward=cp_forward, batch=batch, seqlen=seqlen,
                                                   indices=indices)
            loss_fn.bound_entropies = entropy[:, :-1][:, -num_actions:]
            return output

        actor._forward_backbone = backbone_observed
    actor.forward = forward_with_entropy
    try:
        yield
    finally:
        del actor.forward
        vars(actor).pop("_forward_backbone", None)
