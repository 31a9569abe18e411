"""The Molt contract (plugin/seams.py): the installed Molt 0.2.1 is as the contract says, and a Molt
in which any one checked symbol differs stops in one line naming that symbol and the tested
version, in-process here for every symbol, and end to end in Molt's driver. (A Ray worker that
finds a drifted Molt: tests/test_ray_workers.py.)

vLLM stands in as in tests/test_launch_policy_lag.py (only `SamplingParams` is imported by
Molt's trainer modules) where it is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from molt_flashreinforce.plugin import seams

VLLM_STANDIN = Path(__file__).parents[1] / "molt_flashreinforce" / "rehearsal" / "vllm_standin"


@pytest.fixture
def molt_importable(monkeypatch):
    if importlib.util.find_spec("vllm") is None:
        monkeypatch.syspath_prepend(str(VLLM_STANDIN))
    seams._checked.cache_clear()  # every case checks afresh
    seams.check_under.cache_clear()
    yield
    seams._checked.cache_clear()
    seams.check_under.cache_clear()


def tampered(*args, **kwargs):
    """Stands for a Molt function whose parameters and source changed."""


def tamper(seam: seams.Seam, monkeypatch, tmp_path: Path) -> None:
    """Change the one symbol `seam` checks, as a Molt release might."""
    if seam.main_block:  # a copy of the module's source whose __main__ block ends otherwise
        module = seams.resolve(seam.path)
        source = Path(module.__file__).read_text(encoding="utf-8")
        copy = tmp_path / "train_rl_ray.py"
        copy.write_text(source.rstrip() + "\n    print('trained')\n", encoding="utf-8")
        monkeypatch.setattr(module, "__file__", str(copy))
        return
    owner_path, _, name = seam.path.rpartition(".")
    owner = seams.resolve(owner_path)
    if hasattr(owner, "__ray_metadata__"):  # a method of an actor: the class Ray captured holds it
        owner = owner.__ray_metadata__.modified_class
    original = getattr(owner, name)
    if seam.kind is not None:
        replacement = set(original)  # a plain set where Molt had a frozenset
    elif seam.ray_actor:
        replacement = type(name, (), {})  # a class Ray did not capture
    elif isinstance(original, type):
        replacement = type(name, (original,), {})  # same methods, its source no longer assigns them
    else:
        replacement = tampered  # other parameters, other source, not a property
    monkeypatch.setattr(owner, name, replacement)


def test_the_installed_molt_is_as_the_contract_says(molt_importable):
    assert {seam.path: seams.problem(seam) for seam in seams.CONTRACT} == {seam.path: None for seam in seams.CONTRACT}
    seams.check()


@pytest.mark.parametrize("seam", seams.CONTRACT, ids=lambda seam: seam.path)
def test_each_checked_symbol_tampered_stops_in_one_line_naming_it(seam, molt_importable, monkeypatch, tmp_path):
    tamper(seam, monkeypatch, tmp_path)
    with pytest.raises(seams.MoltDrift) as drift:
        seams.check()
    line = str(drift.value)
    assert "\n" not in line
    assert line.startswith(f"Molt's {seam.path} ") and "as in molt-rl 0.2.1; install a tested molt-rl" in line


def test_vllms_worker_checks_the_symbols_it_uses_and_only_those(molt_importable, monkeypatch, tmp_path):
    """The rehearsal's vLLM worker extension checks WorkerWrap's seams without importing Molt's trainer."""
    worker = ("molt.trainer.vllm.vllm_worker_wrap.", "molt.utils.distributed_util.")
    used = [seam for seam in seams.CONTRACT if seam.path.startswith(worker)]
    assert {seam.path.rpartition(".")[2] for seam in used} >= {"update_weights_packed", "init_process_group",
                                                                "stateless_init_process_group"}
    with monkeypatch.context() as tampering:
        tamper(next(seam for seam in seams.CONTRACT if seam.path.endswith(".PolicyTrainer.training_step")),
               tampering, tmp_path)
        seams.check_under(*worker)  # a trainer symbol is not the worker's business
    receive = next(seam for seam in used if seam.path.endswith(".update_weights_packed"))
    tamper(receive, monkeypatch, tmp_path)
    seams.check_under.cache_clear()  # a process checks once
    with pytest.raises(seams.MoltDrift, match=r"^Molt's molt\.trainer\.vllm\.vllm_worker_wrap\.WorkerWrap\.update_weights_packed "):
        seams.check_under(*worker)


def test_molt_is_checked_before_the_rehearsal_replaces_its_engine_actor(molt_importable, monkeypatch):
    """The stand-in engine replaces Molt's RolloutRayActor in the rehearsal's driver; the check of
    the contract (which the driver runs again later) saw Molt's own class."""
    import ray
    from molt.trainer.vllm import vllm_engine

    class Engine:
        pass

    monkeypatch.setattr(vllm_engine, "RolloutRayActor", vllm_engine.RolloutRayActor)  # restored after the test
    seams.replace_rollout_actor(ray.remote(Engine))
    assert vllm_engine.RolloutRayActor.__ray_metadata__.class_name.endswith(".Engine")
    seams.check()  # passes: checked before the replacement
    seams._checked.cache_clear()
    with pytest.raises(seams.MoltDrift, match=r"RolloutRayActor is not the @ray.remote class it was"):
        seams.check()  # what a check after the replacement would have said


def test_a_module_that_needs_a_package_this_process_lacks_is_not_checked_here(monkeypatch):
    """A CPU-only dry run has no vLLM: Molt's trainer modules cannot run there, nor be checked."""
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "molt.trainer.rollout.samples_generator", raising=False)  # imports vllm
    with pytest.raises(seams.Unavailable):
        seams.resolve("molt.trainer.rollout.samples_generator.SamplesGenerator")
    assert seams.problem(seams.Seam("molt.trainer.rollout.samples_generator.SamplesGenerator", "(self)")) is None
    assert seams.problem(seams.Seam("molt.models.loss.NoSuchLoss")).startswith("is missing")


MOLT_DRIVER = textwrap.dedent("""
    import sys
    from molt.models import actor
    def _restore_full_sequence(self, t, *, cp_forward, batch, seqlen):  # a Molt that dropped `indices`
        return t
    actor.Actor._restore_full_sequence = _restore_full_sequence
    from molt_flashreinforce.launch import molt_main
    molt_main.main(sys.argv[1:])
""")


@pytest.mark.slow
def test_molts_driver_refuses_a_tampered_symbol_in_one_line_before_ray(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(VLLM_STANDIN), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", MOLT_DRIVER, "--actor.model_name_or_path", "none"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = [line for line in done.stderr.splitlines() if line.startswith("molt-flashreinforce:")]
    assert done.returncode == 2, done.stderr[-3000:]
    assert lines == [
        "molt-flashreinforce: Molt's molt.models.actor.Actor._restore_full_sequence takes (self, t, *, cp_forward, "
        "batch, seqlen), not (self, t, *, cp_forward, batch, seqlen, indices): molt-flashreinforce relies on it as "
        "in molt-rl 0.2.1; install a tested molt-rl"]
    assert "Traceback" not in done.stderr and "ray.init" not in done.stdout
