"""`register()`: make `flashreinforce` a Molt advantage estimator and policy loss in this process.

Idempotent. It checks that Molt is as tested (plugin/seams.py), registers both names in Molt's
own registries, and hooks Molt's `PolicyTrainer` (the loss owner inside each `PolicyModelActor`,
plugin/seams.py) so that
`--actor.loss_mode flashreinforce` builds `FlashReinforcePolicyLoss` and feeds it what Molt's
surrogate signature cannot carry: the micro-batch's rewards (failure labels) and, for the
entropy filter, the per-token entropies of the same forward pass. With `--flashreinforce.fused_head`
(the default) that forward runs the chunked head (fused_head.py, installed by plugin/seams.py
`fusing_head`), which never holds the [S, V] logits and returns the entropies with the log-probs;
without it the entropies are computed in slabs from the logits that forward already holds (no
float32 copy of them, no second forward).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from molt_flashreinforce import metrics
from molt_flashreinforce.plugin import seams
from molt_flashreinforce.plugin.policy_loss import LOSS_NAME, FlashReinforcePolicyLoss, policy_loss_from_args

ESTIMATOR_NAME = "flashreinforce"
_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    seams.check()
    from molt.models.loss import register_policy_loss
    from molt.trainer.algorithm.advantage import register_advantage_estimator

    from molt_flashreinforce.plugin.estimator import flashreinforce_estimator
    from molt_flashreinforce.plugin.policy_loss import flashreinforce_surrogate

    register_advantage_estimator(ESTIMATOR_NAME)(flashreinforce_estimator)
    # One reward per rollout, as Molt's group estimators get: an agent that splits a trajectory into
    # several samples would otherwise weigh it several times in the batch-mean baseline.
    seams.count_as_group_estimator(ESTIMATOR_NAME)
    register_policy_loss(LOSS_NAME)(flashreinforce_surrogate)
    seams.wrap_policy_trainer(built=_policy_trainer_built, stepping=_policy_training_step)
    _registered = True


def _policy_trainer_built(trainer) -> None:
    if trainer.args.actor.loss_mode == LOSS_NAME:
        trainer.actor_loss_fn = policy_loss_from_args(trainer.args)
        refusal = trainer.args.flashreinforce.fused_head and seams.fused_head_refusal(trainer.args, trainer.actor)
        if refusal:
            raise ValueError(refusal)


@contextmanager
def _policy_training_step(trainer, experience):
    """Bind what the loss reads beyond Molt's arguments for this step: the experience (rewards as
    failure labels) and, for the entropy filter, the entropies of the step's own forward. Record in
    the experience's info, which Molt logs, whether the fused head computed the step's log-probs
    (`metrics.FUSED_HEAD`: 0 until it has)."""
    loss_fn = trainer.actor_loss_fn
    if not isinstance(loss_fn, FlashReinforcePolicyLoss):
        yield
        return
    loss_fn.bound_experience = experience
    fused_key, rows = metrics.step_key(metrics.FUSED_HEAD), experience.action_mask.shape[0]
    experience.info[fused_key] = torch.zeros(rows, device=experience.action_mask.device)

    def deliver(entropies):
        loss_fn.bound_entropies = entropies

    def fused_head_ran():
        experience.info[fused_key] = torch.ones(rows, device=experience.action_mask.device)

    num_actions = experience.action_mask.shape[1]
    try:
        if trainer.args.flashreinforce.fused_head:
            with seams.fusing_head(trainer, deliver if loss_fn.config.uses_entropy_filter else None, num_actions,
                                   ran=fused_head_ran):
                yield
        elif loss_fn.config.uses_entropy_filter:
            with seams.capturing_action_entropies(trainer, deliver, num_actions):
                yield
        else:
            yield
    finally:
        loss_fn.bound_experience = None
        loss_fn.bound_entropies = None
