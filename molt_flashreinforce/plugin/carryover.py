"""Prompts that were dispatched but not trained carry over a resume: no prompt skipped, none twice.

What Molt 0.2.1's own resume defines: the checkpoint after step k holds the prompt loader's
position as it was when step k's batch was collected (`rl_trainer.GenerateSamplesActor.fit`). By
then the generator had already dispatched more prompts than that batch holds: the rollouts still
in flight (up to `rollout.vllm_generate_batch_size` under partial rollout) and the finished
surplus kept for the next batch. A resume restores the loader past all of them, so those prompts
are never trained (`--ckpt.warm_resume_rollouts` keeps the finished surplus, not the rest).
Prompts dispatched after that moment (the batches trained after step k and then lost with the
crash) lie beyond the saved position and are sampled again as usual.

`install()` (idempotent, run in every Ray worker by our setup hook and in the driver) patches
Molt's `SamplesGenerator`, which runs in `GenerateSamplesActor`:

* `_dispatch_to_agent_runners` remembers the prompt (prompt, label, image, tools) of every
  rollout group it dispatches, and `_filter_group` hands it on to the group's finished samples
  (a group Molt drops, filtered or too old, is consumed as Molt defines: its slot took a fresh
  prompt).
* `state_dict()`, which Molt stores with each batch and so in the checkpoint of the step that
  trains it, gains `untrained_prompts`: the prompts of the rollouts in flight and of the finished
  groups not shipped yet (except those Molt's warm resume saved itself).
* `load_state_dict()` of a resumed run takes them, and the first round after it dispatches them
  before the loader's next prompt. They are generated afresh, under the resumed weights.
* When the episode's last prompt had been dispatched by then, Molt's checkpoint already points at
  the next episode with a fresh loader (`prompts_drained`). `GenerateSamplesActor.fit` then first
  runs the rest of the episode the checkpoint was in: a round of the carried prompts alone.

So every prompt of an episode reaches the loss once in the weights finally saved, and a run that
restarts trains as many steps as one that did not. The prompts travel in Molt's client state
(Ray's queue, then `extra_state.pt`): a few KiB each.
"""

from __future__ import annotations

import functools

from molt_flashreinforce.plugin.patching import patch_once

UNTRAINED_KEY = "untrained_prompts"
DRAINED_KEY = "untrained_prompts_end_their_episode"
_INSTALLED_MARK = "_molt_flashreinforce_carryover"


class CarriedFirst:
    """The prompt loader, yielding the carried prompts first (in the loader's item layout) on its
    next pass, followed by the loader's own prompts unless `alone` (the rest of a drained
    episode); later passes, len, sampler and state are the loader's own."""

    def __init__(self, loader, carried: list[tuple], alone: bool = False) -> None:
        self._loader = loader
        self._carried = list(carried)
        self._alone = alone

    @property
    def ends_an_episode(self) -> bool:
        return bool(self._carried) and self._alone

    def __iter__(self):
        carried, self._carried = self._carried, []
        for prompt, label, image, tools in carried:
            yield None, [prompt], [label], [image], [tools]
        if not (carried and self._alone):
            yield from self._loader

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name):
        return getattr(self._loader, name)


def _group_key(sample):
    from molt.trainer.rollout.samples_generator import _sample_group_key

    return _sample_group_key(sample)


def untrained_prompts(generator, finished_too: bool = True) -> list[tuple]:
    """The prompts `generator` dispatched whose groups are in flight, or (`finished_too`) finished
    and not shipped yet."""
    by_ref = generator.__dict__.get("_carryover_by_ref", {})
    by_group = generator.__dict__.get("_carryover_by_group", {})
    in_flight = [by_ref[ref] for ref in getattr(generator, "_inflight_rollouts", ()) if ref in by_ref]
    waiting = {_group_key(sample) for sample in getattr(generator, "_finished_samples", ())}
    for shipped in set(by_group) - waiting:  # trained (or about to be): no longer ours to carry
        del by_group[shipped]
    return in_flight + ([by_group[key] for key in waiting if key in by_group] if finished_too else [])


def _patch_generator(generator_class) -> None:
    dispatch = generator_class._dispatch_to_agent_runners
    filter_group = generator_class._filter_group
    state_dict = generator_class.state_dict
    load_state_dict = generator_class.load_state_dict

    @functools.wraps(dispatch)
    def dispatch_remembering_prompts(self, prompts, labels, *, images=None, tools=None, **kwargs):
        refs = dispatch(self, prompts, labels, images=images, tools=tools, **kwargs)
        by_ref = self.__dict__.setdefault("_carryover_by_ref", {})
        images = images if images is not None else [None] * len(prompts)
        tools = tools if tools is not None else [None] * len(prompts)
        for ref, prompt in zip(refs, zip(prompts, labels, images, tools)):
            by_ref[ref] = prompt
        return refs

    @functools.wraps(filter_group)
    def filter_group_handing_on(self, finished_rollout, *args, **kwargs):
        samples = filter_group(self, finished_rollout, *args, **kwargs)
        prompt = self.__dict__.get("_carryover_by_ref", {}).pop(finished_rollout, None)
        if prompt is not None and samples:
            self.__dict__.setdefault("_carryover_by_group", {})[_group_key(samples[0])] = prompt
        return samples

    @functools.wraps(state_dict)
    def state_dict_with_untrained(self):
        state = dict(state_dict(self) or {})
        # With Molt's warm resume the finished groups are saved themselves (state["buffer_file"]).
        state[UNTRAINED_KEY] = untrained_prompts(self, finished_too=not state.get("buffer_file"))
        state[DRAINED_KEY] = bool(self.prompts_drained)
        return state

    @functools.wraps(load_state_dict)
    def load_state_dict_with_untrained(self, state):
        load_state_dict(self, state)
        carried = (state or {}).get(UNTRAINED_KEY) or []
        if carried:
            loader = self.prompts_dataloader
            loader = loader._loader if isinstance(loader, CarriedFirst) else loader
            self.prompts_dataloader = CarriedFirst(loader, carried, alone=bool(state.get(DRAINED_KEY)))

    generator_class._dispatch_to_agent_runners = dispatch_remembering_prompts
    generator_class._filter_group = filter_group_handing_on
    generator_class.state_dict = state_dict_with_untrained
    generator_class.load_state_dict = load_state_dict_with_untrained


def _patch_generator_actor(actor_class) -> None:
    fit = actor_class.fit

    @functools.wraps(fit)
    def fit_ending_the_checkpoints_episode(self, episode: int, total_consumed_prompts: int) -> None:
        loader = self.samples_generator.prompts_dataloader
        if isinstance(loader, CarriedFirst) and loader.ends_an_episode:
            episode -= 1  # the checkpoint's own episode, whose carried prompts are its last
        return fit(self, episode, total_consumed_prompts)

    actor_class.fit = fit_ending_the_checkpoints_episode


def install() -> None:
    """Patch Molt's SamplesGenerator and GenerateSamplesActor (the class `@ray.remote` captured,
    plugin/policy_lag.py says why) in this process (idempotent)."""
    from molt.trainer import rl_trainer
    from molt.trainer.rollout.samples_generator import SamplesGenerator

    patch_once(((SamplesGenerator, _patch_generator),
                (rl_trainer.GenerateSamplesActor.__ray_metadata__.modified_class, _patch_generator_actor)), _INSTALLED_MARK)
