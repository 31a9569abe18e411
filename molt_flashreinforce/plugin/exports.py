"""Hugging Face exports at the steps a paper table reports, kept out of Molt's checkpoint rotation.

Molt keeps `--ckpt.max_num` checkpoints (3 by default) and rotates older ones away, and its
`--ckpt.save_hf` exports rotate with them, so by the end of a run the weights of the steps the paper
reports are gone. With `--flashreinforce.export_steps` / `--flashreinforce.export_every` and
`--flashreinforce.export_dir` (rendered from the Hydra `exports` node), `after_step(trainer, step)`
runs in Molt's `TrainingActor` right after Molt's own step end (`HOOKS.step_ended`, at Molt's
seams: plugin/seams.py; before progress reports the step) and, at a kept step:

1. asks every policy rank for Molt's own HF export (`export_hf_model`, what Molt runs at the end of
   training), which writes `--ckpt.output_dir`; a final export already there is moved aside first
   and put back after;
2. moves it to `<export_dir>/step_<N>/` (a rename on one file system; a step exported again, after
   a restart, replaces the earlier one).

Nothing else of Molt's changes: its checkpoints, their cadence and rotation are its own.
`wanted(args, step)` says whether a step is kept.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from molt_flashreinforce.plugin.seams import RuntimeHooks

STEP_DIR = "step_{step}"
_ASIDE = ".before_export"


def _options(args):
    return getattr(args, "flashreinforce", None)


def export_dir(args) -> Path | None:
    directory = getattr(_options(args), "export_dir", None)
    return Path(directory) if directory else None


def wanted(args, step: int) -> bool:
    options = _options(args)
    if options is None or export_dir(args) is None or step < 1:
        return False
    every = getattr(options, "export_every", None)
    return step in (getattr(options, "export_steps", None) or []) or bool(every and step % every == 0)


def _replace(source: Path, target: Path) -> None:
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.move(str(source), str(partial))  # a rename when both lie on one file system
    if target.exists():
        shutil.rmtree(target)
    os.replace(partial, target)


def after_step(trainer, step: int) -> Path | None:
    """Export and keep the policy at `step` when it is a kept step; returns where it went."""
    import ray

    if not wanted(trainer.args, step):
        return None
    output = Path(trainer.args.ckpt.output_dir)
    aside = output.with_name(output.name + _ASIDE)
    if output.exists():
        shutil.rmtree(aside, ignore_errors=True)
        output.rename(aside)
    try:
        ray.get(trainer.actor_model_group.async_export_hf_model())
        target = export_dir(trainer.args) / STEP_DIR.format(step=step)
        target.parent.mkdir(parents=True, exist_ok=True)
        _replace(output, target)
    finally:
        if aside.exists():
            shutil.rmtree(output, ignore_errors=True)
            aside.rename(output)
    return target


class Exports(RuntimeHooks):
    """The kept exports' part at Molt's seams."""

    def step_ended(self, trainer, global_step, checkpoint_saved) -> None:
        after_step(trainer, int(global_step))


HOOKS = Exports()
