"""Lag mechanics of the local backend: a lag-k batch is sampled by the policy exactly k updates old,
with that policy's log-probs stored, and each fresh batch gets exactly one optimizer step."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from molt_flashreinforce import metrics as tags
from molt_flashreinforce.local.config import LocalConfig, LocalConfigError
from molt_flashreinforce.local.model import response_log_probs
from molt_flashreinforce.local.snapshots import PolicySnapshots
from molt_flashreinforce.local.trainer import LocalTrainer

FLASH = OmegaConf.create({"name": "flashreinforce", "group_size": 1, "delta": float("inf")})


def small_config(lag: int, **overrides) -> LocalConfig:
    values = dict(
        steps=10, rollouts_per_step=32, policy_lag=lag, lr=1e-2, weight_decay=0.0, progress_bar=False,
        task={"max_operand": 9, "eval_size": 10},
        model={"n_layer": 1, "n_embd": 32, "n_head": 2},
        warm_start={"steps": 40, "batch_size": 64, "lr": 1e-2},
    )
    values.update(overrides)
    return LocalConfig.from_node(values)


def test_snapshots_hold_exactly_the_versions_still_needed():
    snapshots = PolicySnapshots(lag=3)
    layer = torch.nn.Linear(2, 2)
    for version in range(7):
        snapshots.record(version, layer)
        assert snapshots.versions() == list(range(max(0, version - 3), version + 1))
    assert [snapshots.behavior_version(v) for v in range(6)] == [0, 0, 0, 0, 1, 2]
    with pytest.raises(KeyError, match="no snapshot of policy version 1"):
        snapshots.load_into(layer, 1)


@pytest.mark.parametrize("lag", [0, 3])
def test_batch_for_update_v_was_sampled_by_version_v_minus_k(lag):
    trainer = LocalTrainer(small_config(lag), FLASH, seed=0)
    trainer.warm_start()
    weights = {0: {k: v.clone() for k, v in trainer.policy.state_dict().items()}}
    lags = []
    for _ in range(6):
        logged = trainer.step()
        lags.append(logged[tags.POLICY_LAG_MAX])
        assert logged[tags.POLICY_LAG_MEAN] == logged[tags.POLICY_LAG_MAX]
        weights[trainer.version] = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    # The first updates see version 0, as a queue filled by the initial weights would.
    assert lags == [min(v, lag) for v in range(6)]
    # Exactly one optimizer step per batch: Adam's step count equals the number of batches.
    assert all(s["step"] == 6 for s in trainer.optimizer.state_dict()["state"].values())

    rollouts, _ = trainer.collect()
    assert trainer.version == 6 and rollouts.behavior_version == 6 - lag
    probe = trainer.behavior
    mask = rollouts.mask

    def max_gap(version):
        probe.load_state_dict(weights[version])
        with torch.no_grad():
            recomputed, _ = response_log_probs(probe, rollouts.prompt_ids, rollouts.response_ids, 1.0)
        return (recomputed - rollouts.log_probs)[mask].abs().max().item()

    assert max_gap(6 - lag) < 1e-5  # the stored log-probs are version v-k's
    for other in {5, 6, 6 - lag - 1} - {6 - lag}:
        assert max_gap(other) > 1e-3  # and no other version's: the weights really moved


def test_every_update_gets_a_fresh_batch():
    trainer = LocalTrainer(small_config(2), FLASH, seed=0)
    first, _ = trainer.collect()
    trainer.update(*trainer.collect())
    second, _ = trainer.collect()
    assert not torch.equal(first.prompt_ids, second.prompt_ids)
    assert trainer.rollouts_consumed == 32


def test_grpo_batches_are_groups_of_g_samples_of_one_prompt():
    grpo = OmegaConf.create({"name": "grpo", "group_size": 4, "clip_eps": 0.2})
    trainer = LocalTrainer(small_config(0), grpo, seed=0)
    rollouts, answers = trainer.collect()
    groups = rollouts.prompt_ids.view(8, 4, -1)
    assert (groups == groups[:, :1]).all()
    assert len({tuple(g[0].tolist()) for g in groups}) > 1
    assert answers.view(8, 4).eq(answers.view(8, 4)[:, :1]).all()


def test_bounded_lag_reads_as_in_a_molt_run():
    """Under algo.max_policy_lag the local lag is the same quantity as Molt's (update number minus
    the sampling version); a step is at the bound once the queue of initial weights is used up."""
    bounded = OmegaConf.merge(FLASH, {"max_policy_lag": 3})
    trainer = LocalTrainer(small_config(3, steps=6), bounded, seed=0)
    logged = [trainer.step() for _ in range(6)]
    assert [entry[tags.POLICY_LAG_MAX] for entry in logged] == [0, 1, 2, 3, 3, 3]
    assert [entry[tags.POLICY_LAG_AT_BOUND] for entry in logged] == [0, 0, 0, 1, 1, 1]
    assert all(entry[tags.POLICY_LAG_DROPPED] == 0 for entry in logged)
    assert tags.POLICY_LAG_AT_BOUND not in LocalTrainer(small_config(3), FLASH, seed=0).step()
    with pytest.raises(LocalConfigError, match="local.policy_lag=4 exceeds algo.max_policy_lag=3"):
        LocalTrainer(small_config(4), bounded, seed=0)
