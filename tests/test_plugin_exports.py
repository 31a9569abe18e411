"""HF exports at the kept steps (plugin/exports.py), through Molt's own `save_logs_and_checkpoints`
wrapped at Molt's seams (plugin/seams.py) with the plugin's runtime parts, which call them.

Molt's policy actors (FSDP ranks on GPUs, in Ray) are stood in for by a group whose
`async_export_hf_model` writes what Molt's export writes into `--ckpt.output_dir`; the CPU
rehearsal runs the real export (tests/test_rehearsal_runs.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

from molt_flashreinforce.cluster import progress
from molt_flashreinforce.plugin import exports

VLLM_STANDIN = Path(__file__).parents[1] / "molt_flashreinforce" / "rehearsal" / "vllm_standin"


class _ActorGroup:
    """Stands in for Molt's group of FSDP policy actors: an export writes the weights of the step trained."""

    def __init__(self, output_dir: Path):
        self.output_dir, self.step, self.saved = output_dir, 0, []

    def async_run_method(self, method_name, **kwargs):
        self.saved.append(kwargs["tag"])
        return []

    def async_export_hf_model(self):
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / "config.json").write_text("{}")
        (self.output_dir / "model.safetensors").write_text(f"weights after step {self.step}")
        return []


def trainer_at(tmp_path, monkeypatch, steps, every):
    monkeypatch.setenv(progress.PROGRESS_DIR_VARIABLE, str(tmp_path / "progress"))
    (tmp_path / "progress").mkdir()
    if importlib.util.find_spec("vllm") is None:  # Molt's trainer module imports vLLM's SamplingParams only
        monkeypatch.syspath_prepend(str(VLLM_STANDIN))
    from molt.trainer import rl_trainer
    from molt.trainer.rl_trainer import BaseRLTrainer

    monkeypatch.setattr(rl_trainer.ray, "get", lambda refs: refs)  # the stand-in group's calls are done at once

    from molt_flashreinforce.plugin.ray_hooks import install_runtime_patches
    from molt_flashreinforce.plugin.seams import wrap_trainer

    class Trainer(BaseRLTrainer):  # Molt's method, on a class of our own
        pass

    install_runtime_patches()
    wrap_trainer(Trainer)
    trainer = object.__new__(Trainer)
    trainer.args = SimpleNamespace(
        logger=SimpleNamespace(logging_steps=1),
        ckpt=SimpleNamespace(save_steps=3, output_dir=str(tmp_path / "ckpt" / "hf")),
        flashreinforce=SimpleNamespace(export_steps=steps, export_every=every, export_dir=str(tmp_path / "exports")))
    trainer.wandb_logger = trainer.tensorboard_logger = trainer.critic_model_group = None
    trainer.best_eval_metric_key, trainer.best_eval_metric_value, trainer._latest_eval_metric_value = None, None, None
    trainer.actor_model_group = _ActorGroup(tmp_path / "ckpt" / "hf")
    return trainer


def run_steps(trainer, steps):
    for step in steps:
        trainer.actor_model_group.step = step
        trainer.save_logs_and_checkpoints(step, {}, {})


def test_kept_steps_are_exported_beside_molts_own_checkpoints(tmp_path, monkeypatch):
    trainer = trainer_at(tmp_path, monkeypatch, steps=[2], every=4)
    run_steps(trainer, range(1, 9))
    kept = tmp_path / "exports"
    assert sorted(path.name for path in kept.iterdir()) == ["step_2", "step_4", "step_8"]
    assert (kept / "step_4" / "model.safetensors").read_text() == "weights after step 4"
    assert trainer.actor_model_group.saved == ["global_step3", "global_step6"]  # Molt's own cadence, untouched
    assert not (tmp_path / "ckpt" / "hf").exists()  # nothing left where Molt's final export goes
    assert progress.read_json(tmp_path / "progress" / progress.STEP_FILE)["step"] == 8


def test_a_final_export_already_there_is_kept_and_a_redone_step_replaces_its_export(tmp_path, monkeypatch):
    trainer = trainer_at(tmp_path, monkeypatch, steps=[2], every=None)
    final = tmp_path / "ckpt" / "hf"
    final.mkdir(parents=True)
    (final / "model.safetensors").write_text("the previous run's final export")
    run_steps(trainer, [1, 2])
    trainer.actor_model_group.step = "2 again"  # a restart trains step 2 once more
    trainer.save_logs_and_checkpoints(2, {}, {})
    assert (tmp_path / "exports" / "step_2" / "model.safetensors").read_text() == "weights after step 2 again"
    assert (final / "model.safetensors").read_text() == "the previous run's final export"
    assert [path.name for path in (tmp_path / "exports").iterdir()] == ["step_2"]  # no partial left


def test_which_steps_are_kept():
    args = SimpleNamespace(flashreinforce=SimpleNamespace(export_steps=[600], export_every=None, export_dir="x"))
    assert [step for step in range(0, 1300) if exports.wanted(args, step)] == [600]
    args.flashreinforce.export_every = 1024
    assert [step for step in range(0, 2100) if exports.wanted(args, step)] == [600, 1024, 2048]
    args.flashreinforce.export_dir = None
    assert not exports.wanted(args, 600)
    assert not exports.wanted(SimpleNamespace(), 600)  # a stock Molt command line has no such flags
