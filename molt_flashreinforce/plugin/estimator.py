"""Advantage estimator `flashreinforce` in Molt's estimator signature.

    estimator(rewards (R,), groups, ctx: AdvantageContext) -> (advantages, returns)

A_i = R_i - mean(R) over every sample of the rollout batch (the single-rollout regime has no
prompt group), no whitening; identical advantages and returns. Molt's `TrainingActor` calls it
once per step on the whole batch, after its reward clipping.
"""

from __future__ import annotations

from typing import List, Tuple

import torch
from molt.trainer.algorithm.advantage import AdvantageContext, broadcast_advantages

from molt_flashreinforce.objective import batch_mean_advantages


def flashreinforce_estimator(
    rewards: torch.Tensor, groups: List[List[int]], ctx: AdvantageContext
) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    returns = broadcast_advantages(batch_mean_advantages(rewards), ctx)
    return [ret.clone() for ret in returns], returns
