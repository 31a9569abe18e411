"""The policy-lag probe on Molt's real `SamplesGenerator` and `BaseRLTrainer`.

The generator runs for real on a local CPU Ray whose workers run our setup hook: Molt's
`generate_samples` dispatches each prompt to agent runner actors, joins them with Molt's
`_gather_group` and filters them with its own `_filter_group`. What cannot exist here is stood in
for: vLLM (only its `SamplingParams` type is imported; molt_flashreinforce/rehearsal/vllm_standin), the agent runners
(tiny Ray actors returning one Experience per rollout instead of generating through vLLM) and the
GPU half of `train_step` (an actor update + weight refit; a subclass's `train_step` returns a
status instead).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from types import SimpleNamespace
import types
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
from molt_flashreinforce.plugin import SETUP_HOOK, policy_lag, seams  # noqa: E402
from molt_flashreinforce.plugin.ray_hooks import install_runtime_patches  # noqa: E402


# Ray's workers cannot import this test module: ship what it defines by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


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
def generator():
    # Our launcher's runtime env: every worker runs the setup hook (register + the runtime patches).
    # The stand-in only where no real vLLM is installed: the workers unpickle the driver's SamplingParams.
    stub = str(VLLM_STUB) if importlib.util.find_spec("vllm") is None else None
    pythonpath = os.pathsep.join(filter(None, [stub, os.environ.get("PYTHONPATH")]))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"worker_process_setup_hook": SETUP_HOOK, "env_vars": {"PYTHONPATH": pythonpath}})
    args = parse_and_validate([
        "--actor.model_name_or_path", "unused", "--vllm.num_engines", "1", "--train.agent_path", "unused.py",
        "--actor.num_gpus_per_node", "1", "--rollout.batch_size", "2", "--train.batch_size", "2",
        "--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_threshold", "0.01",
    ])
    runners = [EchoRunner.remote() for _ in range(2)]
    ray.get([r.ready.remote() for r in runners])
    install_runtime_patches()
    prompts = [(None, [f"p{i}", f"p{i + 1}"], ["l", "l"], [None, None], [None, None]) for i in range(0, 12, 2)]
    generator = SamplesGenerator(strategy=types.SimpleNamespace(args=args), prompts_dataloader=prompts,
                                 eval_dataloader=None, tokenizer=None, agent_runners=runners)
    yield generator
    ray.shutdown()


def patched_trainer(during_step=lambda: None):
    """Molt's BaseRLTrainer, its GPU half of `train_step` (update + refit) replaced by `during_step`."""

    class StepTrainer(BaseRLTrainer):
        def __init__(self):
            self.during_step = during_step
            self.args = SimpleNamespace(rollout=SimpleNamespace(batch_size=2, n_samples_per_prompt=1))

        def train_step(self, rollout_samples, global_step):
            self.during_step()
            time.sleep(0.002)  # a real step takes seconds; keep dispatch and refit times distinct
            return {"policy_loss": 0.0}, global_step + 1

    seams.wrap_trainer(StepTrainer)
    return StepTrainer()


def _batch(generator):
    samples, _, _, _ = generator.generate_samples(n_samples_per_prompt=1)
    time.sleep(0.002)
    return samples


def test_install_is_idempotent_and_wraps_molts_real_methods(generator):
    wrapped = SamplesGenerator._dispatch_to_agent_runners
    install_runtime_patches()
    assert SamplesGenerator._dispatch_to_agent_runners is wrapped
    assert BaseRLTrainer.train_step.__wrapped__.__qualname__ == "BaseRLTrainer.train_step"
    assert SamplesGenerator._filter_group.__wrapped__.__qualname__ == "SamplesGenerator._filter_group"


@ray.remote(num_cpus=0)
class TrainerProbe(BaseRLTrainer):
    """Like Molt's TrainingActor: a Ray actor subclassing BaseRLTrainer, shipped to the worker by value."""

    def __init__(self):
        pass

    def probe(self):
        import os

        from molt.trainer.rollout.samples_generator import SamplesGenerator as WorkerGenerator

        return {"pid": os.getpid(),
                "train_step": getattr(type(self).train_step, "__wrapped__", None) is not None,
                "dispatch": getattr(WorkerGenerator._dispatch_to_agent_runners, "__wrapped__", None) is not None}


def test_setup_hook_patches_the_classes_inside_ray_workers(generator):
    result = ray.get(TrainerProbe.remote().probe.remote())
    assert result["pid"] != os.getpid()
    assert result["train_step"] and result["dispatch"]


def test_generated_samples_carry_their_dispatch_time(generator):
    before = time.time()
    samples = _batch(generator)
    assert len(samples) == 2
    stamps = [getattr(s, policy_lag.DISPATCH_TIME_ATTRIBUTE) for s in samples]
    assert all(before <= stamp <= time.time() for stamp in stamps)
    assert "policy_dispatch_time" not in samples[0].info  # not an info entry: Molt would log it as a metric


def test_lag_counts_updates_between_dispatch_and_training(generator):
    """Queue of 1 without force_sync: the next batch is generated while the current one trains."""
    generated_during_step = []
    trainer = patched_trainer(during_step=lambda: generated_during_step.append(_batch(generator)))

    first = _batch(generator)  # version 0 live
    status, step = trainer.train_step(first, 0)
    assert (status[policy_lag.LAG_MEAN_KEY], status[policy_lag.LAG_MAX_KEY]) == (0.0, 0.0)

    stale = generated_during_step.pop()  # dispatched while version 0 was live, trained at step 1
    status, step = trainer.train_step(stale, step)
    assert (status[policy_lag.LAG_MEAN_KEY], status[policy_lag.LAG_MAX_KEY]) == (1.0, 1.0)

    trainer.during_step = lambda: None
    older = generated_during_step.pop()  # dispatched while version 1 was live, trained at step 2
    fresh = _batch(generator)  # version 2 live
    status, step = trainer.train_step([*older, *fresh], step)
    assert status[policy_lag.LAG_MEAN_KEY] == pytest.approx(0.5)
    assert status[policy_lag.LAG_MAX_KEY] == 1.0
    assert step == 3


def test_resumed_run_counts_from_its_restored_step_and_skips_unstamped_samples(generator):
    trainer = patched_trainer()
    samples = _batch(generator)
    status, _ = trainer.train_step(samples, 40)
    assert status[policy_lag.LAG_MAX_KEY] == 0.0
    replayed = [Experience(info={"reward": torch.tensor([0.0])})]  # e.g. --train.rollout_replay_dir
    status, _ = trainer.train_step(replayed, 41)
    assert policy_lag.LAG_MEAN_KEY not in status


def test_each_step_reports_the_trajectories_consumed_so_far(generator):
    trainer = patched_trainer()
    status, step = trainer.train_step(_batch(generator), 0)
    assert status[policy_lag.ROLLOUTS_CONSUMED_KEY] == 2.0  # one batch of 2 prompts x 1 sample
    status, _ = trainer.train_step(_batch(generator), 40)  # resumed at step 40: 41 batches trained
    assert status[policy_lag.ROLLOUTS_CONSUMED_KEY] == 82.0
    assert f"train/{policy_lag.ROLLOUTS_CONSUMED_KEY}" == metrics.ROLLOUTS_CONSUMED


def test_status_keys_are_the_shared_metric_tags():
    assert f"train/{policy_lag.LAG_MEAN_KEY}" == metrics.POLICY_LAG_MEAN
    assert f"train/{policy_lag.LAG_MAX_KEY}" == metrics.POLICY_LAG_MAX


def test_version_clock_boundaries():
    clock = policy_lag.PolicyVersionClock(first_version=5)
    clock.went_live(6, at=10.0)
    clock.went_live(7, at=20.0)
    assert [clock.version_at(t) for t in (0.0, 9.999, 10.0, 19.0, 25.0)] == [5, 5, 6, 6, 7]


def test_install_reaches_the_class_ray_remote_captured():
    """`@ray.remote` wrapped TrainingActor's methods when Molt's module was imported, so a patch of
    BaseRLTrainer alone never reaches the actor; install() patches the captured class itself."""
    from molt.trainer import rl_trainer

    install_runtime_patches()
    captured = rl_trainer.TrainingActor.__ray_metadata__.modified_class
    assert captured in seams.captured_trainer_classes(rl_trainer)
    assert captured.__dict__["train_step"].__name__ == "train_step"  # functools.wraps keeps the name
    assert captured.__dict__["train_step"]._molt_flashreinforce_seam is True
    assert captured.__dict__["train_step"].__wrapped__ is not BaseRLTrainer.__dict__["train_step"]


def test_mixed_version_fraction_counts_trajectories_finishing_after_a_refit():
    clock = policy_lag.PolicyVersionClock(first_version=0)
    clock.went_live(1, at=10.0)
    clock.went_live(2, at=20.0)

    def sample(dispatched, finished):
        return SimpleNamespace(**{policy_lag.DISPATCH_TIME_ATTRIBUTE: dispatched, policy_lag.FINISH_TIME_ATTRIBUTE: finished})

    samples = [sample(5.0, 8.0), sample(5.0, 12.0), sample(12.0, 25.0), sample(15.0, 19.0)]
    stats = policy_lag.lag_statistics(samples, clock, global_step=2)
    assert stats[policy_lag.MIXED_VERSIONS_KEY] == 0.5  # the second and third span a refit
    assert stats[policy_lag.LAG_MEAN_KEY] == pytest.approx((2 + 2 + 1 + 1) / 4)
    assert f"train/{policy_lag.MIXED_VERSIONS_KEY}" == metrics.POLICY_VERSIONS_MIXED
