"""Prompts carry over a resume (plugin/carryover.py) on Molt's real `SamplesGenerator`.

The generator runs for real, with partial rollout and more rollouts in flight than a batch, over
torchdata's `StatefulDataLoader` (what Molt's prompt loader is) on a local CPU Ray. A "crash" is a
fresh generator and loader restored from the state Molt stores with the first batch (the loader's
`state_dict()` and the generator's, as `GenerateSamplesActor.fit` puts them in the client state
that the step's checkpoint saves). Stood in for: vLLM (its `SamplingParams` type only) and the
agent runners (Ray actors returning one trajectory per rollout instead of generating).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest
import ray
import torch

VLLM_STUB = Path(__file__).parents[1] / "molt_flashreinforce" / "rehearsal" / "vllm_standin"  # SamplingParams only
if importlib.util.find_spec("vllm") is None:
    sys.path.insert(0, str(VLLM_STUB))

from molt.trainer.algorithm.experience import Experience  # noqa: E402
from molt.trainer.rollout.samples_generator import SamplesGenerator  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

from molt_flashreinforce.launch.molt_cli import parse_and_validate  # noqa: E402
from molt_flashreinforce.plugin import carryover  # noqa: E402
from molt_flashreinforce.plugin.ray_hooks import install_runtime_patches  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
PROMPTS = [f"prompt {i}" for i in range(12)]
BATCH, IN_FLIGHT = 2, 5


@ray.remote(num_cpus=0)
class PromptEchoRunner:
    """Stands in for Molt's AgentRunnerActor: one finished trajectory per rollout, naming its prompt."""

    def ready(self):
        return True

    def run_group(self, prompt, label, image, sampling_params, truncate_length, n, tools=None, group_id=None):
        return [(Experience(rewards=torch.tensor([1.0]), info={"reward": torch.tensor([1.0])}, prompts=[prompt],
                            group_ids=[group_id], rollout_ids=[f"{group_id}-0"]), None)]


@pytest.fixture(scope="module")
def runners():
    # The stand-in only where no real vLLM is installed: the workers unpickle the driver's SamplingParams.
    stub = str(VLLM_STUB) if importlib.util.find_spec("vllm") is None else None
    pythonpath = os.pathsep.join(filter(None, [stub, os.environ.get("PYTHONPATH")]))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    runners = [PromptEchoRunner.remote() for _ in range(2)]
    ray.get([r.ready.remote() for r in runners])
    install_runtime_patches()
    yield runners
    ray.shutdown()


def loader() -> StatefulDataLoader:
    items = [(None, [prompt], ["label"], [None], [None]) for prompt in PROMPTS]
    return StatefulDataLoader(items, batch_size=None)


def generator(runners, prompts_dataloader, in_flight: int = IN_FLIGHT) -> SamplesGenerator:
    flags = ["--actor.model_name_or_path", "unused", "--vllm.num_engines", "1", "--train.agent_path", "unused.py",
             "--actor.num_gpus_per_node", "1", "--rollout.batch_size", str(BATCH), "--train.batch_size", str(BATCH),
             "--rollout.vllm_generate_batch_size", str(in_flight), "--train.partial_rollout_enable",
             "--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_threshold", "0.01"]
    return SamplesGenerator(strategy=types.SimpleNamespace(args=parse_and_validate(flags)),
                            prompts_dataloader=prompts_dataloader, eval_dataloader=None, tokenizer=None,
                            agent_runners=runners)


def prompts_of(samples) -> list[str]:
    return [sample.prompts[0] for sample in samples]


def first_batch_then_crash(runners, in_flight: int = IN_FLIGHT) -> tuple[list[str], dict, dict]:
    """One batch, and what its step's checkpoint stores: (its prompts, loader state, generator state)."""
    prompts_dataloader = loader()
    first = generator(runners, prompts_dataloader, in_flight)
    samples, _, dispatched, _ = first.generate_samples(n_samples_per_prompt=1)
    assert len(samples) == BATCH and dispatched >= min(in_flight, len(PROMPTS))  # more dispatched than the batch holds
    state = first.state_dict()
    assert len(state[carryover.UNTRAINED_KEY]) == dispatched - BATCH
    return prompts_of(samples), prompts_dataloader.state_dict(), state


def resume(runners, loader_state: dict, generator_state: dict, episodes: int = 1) -> list[list[str]]:
    """The prompts of every batch a resumed generator makes, episode by episode (Molt's resume order)."""
    prompts_dataloader = loader()
    prompts_dataloader.load_state_dict(loader_state)
    resumed = generator(runners, prompts_dataloader)
    resumed.load_state_dict(generator_state)
    trained = [[] for _ in range(episodes)]
    for episode in range(episodes):
        exhausted = False
        while not exhausted:
            samples, _, _, exhausted = resumed.generate_samples(n_samples_per_prompt=1)
            trained[episode] += prompts_of(samples)
    return trained


def test_a_resume_trains_every_prompt_of_the_episode_once(runners):
    first, loader_state, generator_state = first_batch_then_crash(runners)
    (rest,) = resume(runners, loader_state, generator_state)
    assert sorted(first + rest) == sorted(PROMPTS)


def test_a_drained_episode_ends_with_its_carried_prompts_then_the_next_starts_afresh(runners):
    """Every prompt dispatched before the first batch: Molt's checkpoint points at the next episode
    with a fresh loader, so the resume first trains the carried prompts alone."""
    first, _, generator_state = first_batch_then_crash(runners, in_flight=len(PROMPTS))
    assert generator_state[carryover.DRAINED_KEY]
    rest, next_episode = resume(runners, {}, generator_state, episodes=2)  # Molt saves {} for a drained loader
    assert sorted(first + rest) == sorted(PROMPTS) and sorted(next_episode) == sorted(PROMPTS)


def test_without_the_carried_prompts_molts_resume_skips_those_in_flight(runners):
    """The control: the loader's position alone resumes past the prompts still in flight."""
    first, loader_state, generator_state = first_batch_then_crash(runners)
    skipped = {prompt for prompt, *_ in generator_state[carryover.UNTRAINED_KEY]}
    (rest,) = resume(runners, loader_state, {})
    assert sorted(first + rest) == sorted(set(PROMPTS) - skipped) and len(skipped) >= IN_FLIGHT - BATCH


def test_the_carried_prompts_are_dispatched_once_then_the_loader_goes_on():
    items = [(None, ["a"], ["l"], [None], [None])]
    carried = carryover.CarriedFirst(items, [("c", "l", None, None)])
    assert [item[1] for item in carried] == [["c"], ["a"]]
    assert [item[1] for item in carried] == [["a"]] and len(carried) == 1
    alone = carryover.CarriedFirst(items, [("c", "l", None, None)], alone=True)
    assert alone.ends_an_episode and [item[1] for item in alone] == [["c"]]
    assert not alone.ends_an_episode and [item[1] for item in alone] == [["a"]]
