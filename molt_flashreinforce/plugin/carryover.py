"""Prompts that were dispatched but not trained carry over a resume: no prompt skipped, none twice.

What Molt 0.2.1's own resume defines: the checkpoint after step k holds the prompt loader's
position as it was when step k's batch was collected (`rl_trainer.GenerateSamplesActor.fit`). By
then the generator had already dispatched more prompts than that batch holds: the rollouts still
in flight (up to `rollout.vllm_generate_batch_size` under partial rollout) and the finished
surplus kept for the next batch. A resume restores the loader past all of them, so those prompts
are never trained (`--ckpt.warm_resume_rollouts` keeps the finished surplus, not the rest).
Prompts dispatched after that moment (the batches trained after step k and then lost with the
crash) lie beyond the saved position and are sampled again as usual.

`HOOKS`, at Molt's seams (plugin/seams.py) in the generator (`GenerateSamplesActor`):

* dispatch remembers the prompt (prompt, label, image, tools) of every rollout group, and
  collection hands it on to the group's finished samples (a group Molt drops, filtered or too
  old, is consumed as Molt defines: its slot took a fresh prompt).
* the state Molt saves with each batch (and so in the checkpoint of the step that trains it)
  gains `untrained_prompts`: the prompts of the rollouts in flight and of the finished groups not
  shipped yet (except those Molt's warm resume saved itself).
* a resumed run's generator takes them when it loads that state, and the first round after it
  dispatches them before the loader's next prompt. They are generated afresh, under the resumed
  weights.
* When the episode's last prompt had been dispatched by then, Molt's checkpoint already points at
  the next episode with a fresh loader (`prompts_drained`). `GenerateSamplesActor.fit` then first
  runs the rest of the episode the checkpoint was in: a round of the carried prompts alone.

So every prompt of an episode reaches the loss once in the weights finally saved, and a run that
restarts trains as many steps as one that did not. The prompts travel in Molt's client state
(Ray's queue, then `extra_state.pt`): a few KiB each.
"""

from __future__ import annotations

from molt_flashreinforce.plugin import seams
from molt_flashreinforce.plugin.seams import RuntimeHooks

UNTRAINED_KEY = "untrained_prompts"
DRAINED_KEY = "untrained_prompts_end_their_episode"


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


def untrained_prompts(generator, finished_too: bool = True) -> list[tuple]:
    """The prompts `generator` dispatched whose groups are in flight, or (`finished_too`) finished
    and not shipped yet."""
    by_ref = generator.__dict__.get("_carryover_by_ref", {})
    by_group = generator.__dict__.get("_carryover_by_group", {})
    in_flight = [by_ref[ref] for ref in seams.inflight_rollouts(generator) if ref in by_ref]
    waiting = {seams.group_key(sample) for sample in seams.finished_samples(generator)}
    for shipped in set(by_group) - waiting:  # trained (or about to be): no longer ours to carry
        del by_group[shipped]
    return in_flight + ([by_group[key] for key in waiting if key in by_group] if finished_too else [])


class CarryOver(RuntimeHooks):
    """Carry-over's part at Molt's seams (plugin/seams.py)."""

    def dispatched(self, generator, refs, prompts) -> None:
        by_ref = generator.__dict__.setdefault("_carryover_by_ref", {})
        for ref, prompt in zip(refs, prompts):
            by_ref[ref] = prompt

    def collected(self, generator, finished, samples, drop_counts):
        prompt = generator.__dict__.get("_carryover_by_ref", {}).pop(finished, None)
        if prompt is not None and samples:
            generator.__dict__.setdefault("_carryover_by_group", {})[seams.group_key(samples[0])] = prompt
        return samples

    def state_saving(self, generator, state) -> None:
        # With Molt's warm resume the finished groups are saved themselves (state["buffer_file"]).
        state[UNTRAINED_KEY] = untrained_prompts(generator, finished_too=not state.get("buffer_file"))
        state[DRAINED_KEY] = bool(generator.prompts_drained)

    def state_loaded(self, generator, state) -> None:
        carried = state.get(UNTRAINED_KEY) or []
        if carried:
            loader = generator.prompts_dataloader
            loader = loader._loader if isinstance(loader, CarriedFirst) else loader
            generator.prompts_dataloader = CarriedFirst(loader, carried, alone=bool(state.get(DRAINED_KEY)))

    def episode_starting(self, actor, episode: int) -> int:
        loader = actor.samples_generator.prompts_dataloader
        if isinstance(loader, CarriedFirst) and loader.ends_an_episode:
            return episode - 1  # the checkpoint's own episode, whose carried prompts are its last
        return episode


HOOKS = CarryOver()
