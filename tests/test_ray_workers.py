"""The plugin is active inside Ray worker processes, where Molt computes advantages and losses.

Each case starts a local CPU Ray cluster in a fresh driver process and asks two actors (worker
processes of their own, like Molt's TrainingActor and PolicyModelActor) what Molt's registries
hold. The actor class is defined in the driver script, so cloudpickle ships it by value: nothing
in the worker imports our package unless the hook does. Without a GPU there is no vLLM; a stub
exposing the one name Molt's trainer modules import (molt_flashreinforce/rehearsal/vllm_standin) stands in for it.
"""

from __future__ import annotations

from importlib import metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

DRIVER = textwrap.dedent(
    """
    import json, sys
    import ray
    from molt.cli.train_rl_ray import _ray_runtime_env_vars

    mode = sys.argv[1]
    runtime_env = {"env_vars": _ray_runtime_env_vars()}
    if mode == "setup_hook":  # our launcher's ray.init
        from molt_flashreinforce.plugin import SETUP_HOOK
        runtime_env["worker_process_setup_hook"] = SETUP_HOOK
    elif mode == "driver_only":  # registering in the driver alone reaches no worker
        from molt_flashreinforce.plugin import register
        register()
    # mode "env_hook": RAY_RUNTIME_ENV_HOOK is set in the environment; this is Molt's own ray.init call.
    # address="local": a Ray of its own, never the cluster a finished job's address file still names
    ray.init(address="local", runtime_env=runtime_env, num_cpus=2, include_dashboard=False, log_to_driver=False)

    @ray.remote(num_cpus=1)
    class Probe:
        def registries(self):
            import os
            from molt.models.loss import POLICY_LOSSES
            from molt.trainer.algorithm.advantage import ADVANTAGE_ESTIMATORS
            from molt.trainer.workers.policy_actor import PolicyTrainer
            return {"pid": os.getpid(), "estimators": sorted(ADVANTAGE_ESTIMATORS), "losses": sorted(POLICY_LOSSES),
                    "trainer_patched": bool(getattr(PolicyTrainer.training_step, "_molt_flashreinforce_seam", False))}

    probes = [Probe.remote() for _ in range(2)]
    print(json.dumps(ray.get([probe.registries.remote() for probe in probes])))
    ray.shutdown()
    """
)


def _vllm_installed() -> bool:
    # Asked of the installed distributions: other tests may put a stand-in into sys.modules.
    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return False
    return True


def probe_workers(mode: str) -> list[dict]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_RUNTIME_ENV_HOOK", None)
    if not _vllm_installed():
        stub = str(Path(__file__).parents[1] / "molt_flashreinforce" / "rehearsal" / "vllm_standin")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [stub, env.get("PYTHONPATH")]))
    if mode == "env_hook":
        env["RAY_RUNTIME_ENV_HOOK"] = "molt_flashreinforce.plugin.ray_hooks.runtime_env_hook"
    result = subprocess.run([sys.executable, "-c", DRIVER, mode], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["setup_hook", "env_hook"])
def test_every_worker_registers_the_plugin(mode):
    workers = probe_workers(mode)
    assert len({worker["pid"] for worker in workers}) == 2 and os.getpid() not in {w["pid"] for w in workers}
    for worker in workers:
        assert "flashreinforce" in worker["estimators"] and "flash_reinforce" in worker["estimators"]
        assert "flashreinforce" in worker["losses"] and "ppo" in worker["losses"]
        assert worker["trainer_patched"]


def test_registering_in_the_driver_alone_does_not_reach_workers():
    for worker in probe_workers("driver_only"):
        assert "flashreinforce" not in worker["estimators"] and "flashreinforce" not in worker["losses"]
        assert not worker["trainer_patched"]


def test_runtime_env_hook_refuses_to_replace_another_setup_hook():
    from molt_flashreinforce.plugin.ray_hooks import SETUP_HOOK, runtime_env_hook

    assert runtime_env_hook(None) == {"worker_process_setup_hook": SETUP_HOOK}
    assert runtime_env_hook({"env_vars": {"A": "1"}})["env_vars"] == {"A": "1"}
    with pytest.raises(ValueError, match="only one"):
        runtime_env_hook({"worker_process_setup_hook": "other.module.hook"})


TAMPERING_HOOK = textwrap.dedent(
    """
    def setup_worker():  # this worker's Molt drifted: Actor._restore_full_sequence lost `indices`
        from molt.models import actor
        def _restore_full_sequence(self, t, *, cp_forward, batch, seqlen):
            return t
        actor.Actor._restore_full_sequence = _restore_full_sequence
        from molt_flashreinforce.plugin.ray_hooks import setup_worker as plugins_hook
        plugins_hook()
    """
)
WORKER_DRIVER = textwrap.dedent(
    """
    import json, pathlib, sys, time
    import ray
    ray.init(address="local", runtime_env={"worker_process_setup_hook": "tampering_hook.setup_worker"}, num_cpus=1,
             include_dashboard=False, log_to_driver=False)

    @ray.remote(num_cpus=1)
    class Probe:
        def ping(self):
            return "ran"

    probe = Probe.remote()
    failure = pathlib.Path(sys.argv[1]) / "failure.json"
    deadline = time.monotonic() + 120
    while not failure.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    print(failure.read_text() if failure.exists() else "{}")
    ray.shutdown()
    """
)


def test_a_worker_whose_molt_drifted_records_one_line_naming_the_symbol(tmp_path):
    """The driver's Molt is as tested, a worker's is not: the worker's setup hook refuses before any
    actor runs and records why for the supervisor (tests/test_supervisor.py: that ends the run)."""
    (tmp_path / "tampering_hook.py").write_text(TAMPERING_HOOK)
    progress = tmp_path / "progress"
    progress.mkdir()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "MOLT_FLASHREINFORCE_PROGRESS_DIR": str(progress)}
    path = [str(tmp_path)] + ([] if _vllm_installed() else [str(Path(__file__).parents[1] / "molt_flashreinforce" / "rehearsal" / "vllm_standin")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*path, env.get("PYTHONPATH")]))
    env.pop("RAY_RUNTIME_ENV_HOOK", None)
    result = subprocess.run([sys.executable, "-c", WORKER_DRIVER, str(progress)], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    failure = json.loads(result.stdout.strip().splitlines()[-1])
    assert failure["what"].startswith("a Ray worker (pid ") and failure["code_fault"] and failure["every_attempt"]
    assert failure["cause"] == (
        "Molt's molt.models.actor.Actor._restore_full_sequence takes (self, t, *, cp_forward, batch, seqlen), not "
        "(self, t, *, cp_forward, batch, seqlen, indices): molt-flashreinforce relies on it as in molt-rl 0.2.1; "
        "install a tested molt-rl")
