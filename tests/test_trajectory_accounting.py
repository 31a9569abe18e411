"""B counts trajectories: FlashREINFORCE's batch-mean baseline runs over one reward per rollout in
Molt's real `RemoteExperienceMaker.compute_advantages_and_returns`, and a batch in which an agent
split trajectories into several samples is refused instead of weighing them once per sample.

Molt's StepEnvRunner (every agent of this package) builds one Trajectory per rollout, whatever
its number of turns, and so one sample; its chat agents can emit several step-samples sharing a
`rollout_id` (a history compaction or non-prefix re-render starts a new segment).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from molt.trainer.algorithm.experience import Experience
from molt.trainer.rollout import experience_maker

from molt_flashreinforce.launch.molt_cli import parse_and_validate
from molt_flashreinforce.plugin import register
from molt_flashreinforce.plugin.registry import ESTIMATOR_NAME


def maker():
    register()
    made = object.__new__(experience_maker.RemoteExperienceMaker)
    made.advantage_estimator = ESTIMATOR_NAME
    made.kl_ctl = SimpleNamespace(value=0.0)
    made.args = parse_and_validate([  # Molt's own defaults, as the TrainingActor holds them
        "--actor.model_name_or_path", "unused", "--vllm.num_engines", "1", "--train.agent_path", "unused.py",
        "--actor.num_gpus_per_node", "1", "--rollout.batch_size", "4", "--train.batch_size", "4",
        "--algo.advantage.estimator", ESTIMATOR_NAME,
    ])
    return made


def experience(rollout_ids, rewards, length=3):
    n = len(rollout_ids)
    return Experience(
        index=list(range(n)), rewards=torch.tensor(rewards), action_mask=torch.ones(n, length, dtype=torch.bool),
        kl=torch.zeros(n, length), info={}, rollout_ids=list(rollout_ids), group_ids=list(rollout_ids),
        response_length=torch.full((n,), float(length)), total_length=torch.full((n,), float(length)),
        truncated=torch.zeros(n, dtype=torch.bool),
    )


def test_flashreinforce_is_one_of_molts_merged_reward_estimators():
    register()
    assert ESTIMATOR_NAME in experience_maker.GROUP_ADVANTAGE_ESTIMATORS


def test_baseline_is_the_mean_over_trajectories_in_molts_experience_maker():
    experiences = [experience(["a", "b"], [1.0, 0.0]), experience(["c", "d"], [0.0, 0.0])]
    out = maker().compute_advantages_and_returns(experiences)
    advantages = torch.cat([e.advantages[:, 0] for e in out])
    torch.testing.assert_close(advantages, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_trajectories_split_into_several_samples_are_refused():
    # rollout "a" arrives as two step-samples with the same terminal reward (Molt's chat path)
    experiences = [experience(["a", "a", "b"], [1.0, 1.0, 0.0])]
    with pytest.raises(NotImplementedError, match="split 2 trajectories into 3 samples"):
        maker().compute_advantages_and_returns(experiences)
