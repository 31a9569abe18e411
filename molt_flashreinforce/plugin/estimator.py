"""Advantage estimator `flashreinforce` in Molt's estimator signature.

    estimator(rewards (R,), groups, ctx: AdvantageContext) -> (advantages, returns)

A_i = R_i - mean(R) over every trajectory of the rollout batch (the single-rollout regime has
no prompt group), no whitening; identical advantages and returns. Molt's `TrainingActor` calls
it once per step on the whole batch, after its reward clipping, with one reward per rollout
(the plugin registers it among Molt's group estimators, which get the merged rewards).

B counts trajectories. Molt's StepEnvRunner agents (all of this package's) produce one sample
per trajectory, however many turns it has. An agent that splits a trajectory into several
samples (Molt's chat agents, at a non-prefix re-render) is refused here: the sample-mean loss
would weigh such a trajectory once per sample.
"""

from __future__ import annotations

from typing import List, Tuple

import torch
from molt.trainer.algorithm.advantage import AdvantageContext, broadcast_advantages

from molt_flashreinforce.objective import batch_mean_advantages


def flashreinforce_estimator(
    rewards: torch.Tensor, groups: List[List[int]], ctx: AdvantageContext
) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    samples = int(ctx.sample_to_rollout.numel())
    if samples != rewards.numel():
        raise NotImplementedError(
            f"the agent split {rewards.numel()} trajectories into {samples} samples; FlashREINFORCE's sample mean "
            "counts each trajectory once and needs one sample per trajectory (a StepEnvRunner agent)."
        )
    returns = broadcast_advantages(batch_mean_advantages(rewards), ctx)
    return [ret.clone() for ret in returns], returns
