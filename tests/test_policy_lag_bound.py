"""The policy-lag bound (`--flashreinforce.max_policy_lag`) on Molt's real classes.

Molt's real `SamplesGenerator.generate_samples` streams prompts through its in-flight pool on a
local CPU Ray, with Molt's `_gather_group` and `_filter_group`; the version board is the real Ray
actor. Stood in for, as in tests/test_launch_policy_lag.py: vLLM (only `SamplingParams` is
imported), the agent runners (tiny actors that return one finished trajectory at once) and the GPU
half of `train_step`. The whole bound through Molt's own actors and queue runs in the CPU
rehearsal (docs/rehearsal.md).
"""

from __future__ import annotations

import importlib.util
import os
import queue
import sys
import threading
import types
from types import SimpleNamespace
from pathlib import Path

import pytest
import ray
import torch

VLLM_STUB = Path(__file__).parents[1] / "molt_flashreinforce" / "rehearsal" / "vllm_standin"  # SamplingParams only
if importlib.util.find_spec("vllm") is None:
    sys.path.insert(0, str(VLLM_STUB))

from molt.trainer.algorithm.experience import Experience  # noqa: E402
from molt.trainer.rl_trainer import BaseRLTrainer  # noqa: E402
from molt.trainer.rollout.samples_generator import SamplesGenerator  # noqa: E402

from molt_flashreinforce import metrics  # noqa: E402
from molt_flashreinforce.launch.molt_cli import parse_and_validate  # noqa: E402
from molt_flashreinforce.plugin import lag_bound, policy_lag, seams  # noqa: E402
from molt_flashreinforce.plugin.ray_hooks import install_runtime_patches  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

BASE_FLAGS = ["--actor.model_name_or_path", "unused", "--vllm.num_engines", "1", "--train.agent_path", "unused.py",
              "--actor.num_gpus_per_node", "1", "--algo.advantage.is_correction_level", "seq",
              "--algo.advantage.is_correction_threshold", "0.01"]


def molt_args(*flags: str):
    return parse_and_validate([*BASE_FLAGS, *flags])


@ray.remote(num_cpus=0)
class EchoRunner:
    """Stands in for Molt's AgentRunnerActor: one finished trajectory per rollout, no generation."""

    def ready(self):
        return True

    def run_group(self, prompt, label, image, sampling_params, truncate_length, n, tools=None, group_id=None):
        sample = Experience(rewards=torch.tensor([1.0]), info={"reward": torch.tensor([1.0])},
                            prompts=[prompt], group_ids=[group_id], rollout_ids=[f"{group_id}-0"])
        return [(sample, None)]


@pytest.fixture(scope="module")
def local_ray():
    # The stand-in only where no real vLLM is installed: the workers unpickle the driver's SamplingParams.
    stub = str(VLLM_STUB) if importlib.util.find_spec("vllm") is None else None
    pythonpath = os.pathsep.join(filter(None, [stub, os.environ.get("PYTHONPATH")]))
    # address="local": a cluster of its own even where another Ray cluster runs on the machine
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    install_runtime_patches()
    yield
    ray.shutdown()


@pytest.fixture
def version_board(local_ray):
    board = lag_bound.board()
    ray.get(board.start.remote(0))
    return board


# ---------------------------------------------------------------- the arithmetic, on Molt's own args


def test_carried_batches_follow_molts_parsed_in_flight_and_partial_rollout():
    assert lag_bound.carried_batches(molt_args("--rollout.batch_size", "4", "--train.batch_size", "4",
                                               "--rollout.vllm_generate_batch_size", "28")) == 7
    # Molt turns partial rollout on itself when more is in flight than one batch (train_rl_ray.py).
    assert lag_bound.carried_batches(molt_args("--rollout.batch_size", "4", "--train.batch_size", "4",
                                               "--rollout.vllm_generate_batch_size", "30")) == 8
    # Without partial rollout Molt drains the pool every batch: nothing is carried.
    assert lag_bound.carried_batches(molt_args("--rollout.batch_size", "128", "--train.batch_size", "128",
                                               "--rollout.vllm_generate_batch_size", "16")) == 0
    # Partial rollout with less than a batch in flight still carries rollouts into the next batch.
    assert lag_bound.carried_batches(molt_args("--rollout.batch_size", "128", "--train.batch_size", "128",
                                               "--rollout.vllm_generate_batch_size", "16",
                                               "--train.partial_rollout_enable")) == 1


def test_hold_back_and_staleness_arithmetic():
    # The batch step 10 trains, 7 batches carried, bound 8: what is dispatched while collecting it
    # trains at step <= 10 + 7 = 17, so version 17 - 8 = 9 must be live.
    assert lag_bound.hold_back_version(next_step=10, carry=7, bound=8) == 9
    assert lag_bound.hold_back_version(next_step=10, carry=0, bound=1) == 9  # GRPO's queue of 1
    assert not lag_bound.is_stale(version=2, training_step=10, bound=8)
    assert lag_bound.is_stale(version=1, training_step=10, bound=8)


def test_the_flag_is_parsed_into_molts_args_for_every_algorithm():
    args = molt_args("--rollout.batch_size", "2", "--train.batch_size", "2", "--flashreinforce.max_policy_lag", "3")
    assert policy_lag.max_policy_lag(args) == 3
    assert policy_lag.max_policy_lag(molt_args("--rollout.batch_size", "2", "--train.batch_size", "2")) is None


# ---------------------------------------------------------------- the board and the hold-back


def test_held_back_slot_waits_for_the_version_the_bound_needs(version_board):
    gate = lag_bound.LagGate(bound=2, carry=3, version_board=version_board)
    gate.next_step = 5  # collect the batch step 5 trains: version 5 + 3 - 2 = 6 must be live
    slots = queue.Queue()
    slots.put(4)
    held = lag_bound.HeldBackSlots(slots, gate)
    got = []
    taker = threading.Thread(target=lambda: got.append(held.get(block=True)))
    taker.start()
    taker.join(timeout=1.0)
    assert taker.is_alive()  # version 0 live
    ray.get(version_board.went_live.remote(5))
    taker.join(timeout=1.0)
    assert taker.is_alive()
    ray.get(version_board.went_live.remote(6))
    taker.join(timeout=10.0)
    assert not taker.is_alive() and got == [4]
    assert held.qsize() == 0  # everything else is Molt's queue


def test_first_hold_back_starts_from_the_trainers_step(version_board):
    ray.get(version_board.start.remote(40))  # a resumed run
    gate = lag_bound.LagGate(bound=8, carry=7, version_board=version_board)
    gate.hold_back()  # 40 + 7 - 8 = 39 <= 40: does not wait
    assert gate.next_step == 40


# ---------------------------------------------------------------- stragglers, in Molt's own generator


def _generator(args, prompts: int, eval_prompts: int = 0):
    runners = [EchoRunner.remote() for _ in range(2)]
    ray.get([r.ready.remote() for r in runners])
    loader = [(None, [f"p{i}"], ["l"], [None], [None]) for i in range(prompts)]
    eval_loader = [(None, [f"e{i}"], ["l"], [None], [None]) for i in range(eval_prompts)]
    return SamplesGenerator(strategy=types.SimpleNamespace(args=args), prompts_dataloader=loader,
                            eval_dataloader=eval_loader, tokenizer=None, agent_runners=runners)


def test_the_eval_at_start_goes_through_the_bounded_generator_before_any_batch(version_board):
    """Molt's eval at step 0 collects through the same `_filter_group` before the first training
    batch has made the in-flight pool; the bound neither needs that pool nor stamps eval samples
    with a version that was never counted."""
    args = molt_args("--rollout.batch_size", "2", "--train.batch_size", "2", "--flashreinforce.max_policy_lag", "1")
    generator = _generator(args, prompts=4, eval_prompts=3)
    lag_bound.attach_gate(generator, args, version_board)
    assert not hasattr(generator, "_inflight_rollouts")
    evaluated = generator.generate_eval_samples(n_samples_per_prompt=1)
    assert len(evaluated) == 3
    samples, _, _, _ = generator.generate_samples(n_samples_per_prompt=1)
    assert [getattr(s, policy_lag.VERSION_ATTRIBUTE) for s in samples] == [0, 0]


def test_stale_groups_are_dropped_counted_and_replaced(version_board):
    """Bound 1 with 3 batches of 2 in flight (a setting the launcher refuses, so that stragglers
    exist): batch 0 (step 0) and batch 1 (step 1) get rollouts dispatched under version 0; with
    version 2 live, the rollouts still in the pool from version 0 are 2 updates old at step 2."""
    args = molt_args("--rollout.batch_size", "2", "--train.batch_size", "2", "--rollout.vllm_generate_batch_size", "6",
                     "--flashreinforce.max_policy_lag", "1")
    generator = _generator(args, prompts=20)
    gate = lag_bound.attach_gate(generator, args, version_board)
    assert (gate.bound, gate.carry) == (1, 3)

    for step in (0, 1):
        samples, rollout_metrics, _, _ = generator.generate_samples(n_samples_per_prompt=1)
        assert [getattr(s, policy_lag.VERSION_ATTRIBUTE) for s in samples] == [0, 0]
        assert rollout_metrics[lag_bound.DROPPED_KEY] == 0.0
    assert gate.next_step == 2
    # After two batches the pool holds 5 rollouts from version 0 (6 dispatched, 2 refills, 4 collected).
    assert [gate.dispatch_versions[ref] for ref in generator._inflight_rollouts] == [0] * 5

    ray.wait(generator._inflight_rollouts, num_returns=5)  # all finished: Molt's ray.wait may return any
    ray.get(version_board.went_live.remote(2))
    samples, rollout_metrics, _, _ = generator.generate_samples(n_samples_per_prompt=1)
    assert len({s.group_ids[0] for s in samples}) == 2  # the batch keeps its size
    assert [getattr(s, policy_lag.VERSION_ATTRIBUTE) for s in samples] == [2, 2]
    # Oldest finished first: all 5 are collected (and dropped) before the fresh ones.
    dropped = rollout_metrics[lag_bound.DROPPED_KEY]
    assert dropped == 5 and all(gate.dispatch_versions[ref] == 2 for ref in generator._inflight_rollouts)
    assert rollout_metrics[f"rollout/dropped/{lag_bound.DROP_REASON}"] == dropped  # Molt's own per-reason tag
    assert f"train/{lag_bound.DROPPED_KEY}" == metrics.POLICY_LAG_DROPPED


def test_unbounded_generator_is_molts_own(local_ray):
    args = molt_args("--rollout.batch_size", "2", "--train.batch_size", "2")
    generator = _generator(args, prompts=4)
    assert lag_bound.attach_gate(generator, args, version_board=None) is None
    samples, rollout_metrics, _, _ = generator.generate_samples(n_samples_per_prompt=1)
    assert len(samples) == 2 and lag_bound.DROPPED_KEY not in rollout_metrics
    assert all(getattr(s, policy_lag.VERSION_ATTRIBUTE, None) is None for s in samples)


# ---------------------------------------------------------------- the trainer's side


def _bounded_trainer(bound: int | None):
    class StepTrainer(BaseRLTrainer):
        def __init__(self):
            self.args = SimpleNamespace(rollout=SimpleNamespace(batch_size=2, n_samples_per_prompt=1),
                                        flashreinforce=SimpleNamespace(max_policy_lag=bound))

        def fit(self, global_step: int = 0):
            return global_step

        def train_step(self, rollout_samples, global_step):
            return {}, global_step + 1

    seams.wrap_trainer(StepTrainer)
    return StepTrainer()


def _stamped(version: int, dispatched_at: float = 0.0):
    return SimpleNamespace(**{policy_lag.VERSION_ATTRIBUTE: version, policy_lag.DISPATCH_TIME_ATTRIBUTE: dispatched_at})


def test_trainer_posts_its_start_and_each_version_it_makes_live(version_board):
    trainer = _bounded_trainer(bound=8)
    trainer.fit(global_step=12)
    assert ray.get(version_board.live.remote()) == 12
    status, step = trainer.train_step([_stamped(4), _stamped(12)], 12)
    assert ray.get(version_board.live.remote()) == 13 == step
    # Read from the board's stamps, not the clock (dispatch times of 0 would read as version 12).
    assert status[policy_lag.LAG_MEAN_KEY] == 4.0 and status[policy_lag.LAG_MAX_KEY] == 8.0
    assert status[policy_lag.AT_BOUND_KEY] == 1.0
    status, _ = trainer.train_step([_stamped(10)], 13)
    assert status[policy_lag.AT_BOUND_KEY] == 0.0
    assert f"train/{policy_lag.AT_BOUND_KEY}" == metrics.POLICY_LAG_AT_BOUND


def test_a_trajectory_past_the_bound_never_reaches_the_loss(version_board):
    trainer = _bounded_trainer(bound=8)
    trainer.fit(global_step=0)
    with pytest.raises(RuntimeError, match="9 updates old, past --flashreinforce.max_policy_lag 8"):
        trainer.train_step([_stamped(1)], 10)


def test_unbounded_trainer_reports_no_bound_fields(local_ray):
    trainer = _bounded_trainer(bound=None)
    trainer.fit(global_step=0)
    status, _ = trainer.train_step([_stamped(0)], 20)
    assert status[policy_lag.LAG_MAX_KEY] == 20.0 and policy_lag.AT_BOUND_KEY not in status


def test_install_reaches_the_actor_classes_ray_captured(local_ray):
    from molt.trainer import rl_trainer

    install_runtime_patches()
    generator_actor = rl_trainer.GenerateSamplesActor.__ray_metadata__.modified_class
    training_actor = rl_trainer.TrainingActor.__ray_metadata__.modified_class
    assert generator_actor.__dict__["__init__"].__wrapped__.__qualname__ == "GenerateSamplesActor.__init__"
    assert training_actor.__dict__["fit"].__wrapped__.__qualname__ == "TrainingActor.fit"
    wrapped = SamplesGenerator.generate_samples
    install_runtime_patches()
    assert SamplesGenerator.generate_samples is wrapped
