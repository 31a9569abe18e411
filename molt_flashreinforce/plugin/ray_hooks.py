"""Ray hooks that make the plugin active in every Molt worker process.

Molt computes advantages in its `TrainingActor` and the loss in each `PolicyModelActor`, both Ray
actors in processes of their own, so registering in the driver changes nothing there.

* `setup_worker`: Ray's `worker_process_setup_hook`; every worker runs it at start-up, before it
  deserialises an actor or a task. It checks that Molt is as tested (a worker that finds it is
  not records why and raises: `refuse_a_drifted_molt`), registers the plugin, installs the
  runtime patches (`install_runtime_patches`) and, under the supervisor, leaves SLURM's signals to
  it (plugin/progress.py). Our launcher passes it to `ray.init`.
* `runtime_env_hook`: for `RAY_RUNTIME_ENV_HOOK=molt_flashreinforce.plugin.ray_hooks.runtime_env_hook`
  with the stock `python -m molt.cli.train_rl_ray`: Ray calls it inside Molt's own `ray.init` and it
  adds the setup hook (and a user's acceptance of an untested Molt,
  plugin/compat.py) to the job's runtime environment, and installs the runtime patches in the
  driver, where Molt's actor classes are shipped from, after checking that Molt is as tested. (Ray skips this hook under `uv run`.)
"""

from __future__ import annotations

SETUP_HOOK = "molt_flashreinforce.plugin.ray_hooks.setup_worker"


def runtime_parts() -> tuple:
    """The plugin's parts at Molt's runtime seams, in the order each hook runs them: the lag probe
    stamps and times before anything reads the stamps; carry-over records a group before the bound
    may drop it as stale (a dropped group is consumed, as Molt defines); the bound posts a version to
    its board after the probe's clock saw it go live; a kept step is exported before progress reports
    the step; progress reports last, what the others did."""
    from molt_flashreinforce.plugin import carryover, exports, lag_bound, policy_lag, progress

    return (policy_lag.HOOKS, carryover.HOOKS, lag_bound.HOOKS, exports.HOOKS, progress.HOOKS)


def install_runtime_patches() -> None:
    """Molt's runtime classes wrapped once in this process (idempotent), calling `runtime_parts()`,
    after checking that Molt is as tested (plugin/seams.py)."""
    from molt_flashreinforce.plugin import seams

    seams.install(runtime_parts())


def setup_worker() -> None:
    from molt_flashreinforce.plugin.progress import defer_slurm_signals
    from molt_flashreinforce.plugin.registry import register

    refuse_a_drifted_molt()
    register()
    install_runtime_patches()
    defer_slurm_signals()


def refuse_a_drifted_molt() -> None:
    """Check Molt (plugin/seams.py) in this worker; a Molt other than the tested one raises, and under
    the supervisor the worker first records why (cluster/progress.py), so that the attempt stops at
    once, in that line, and is not restarted."""
    import os

    from molt_flashreinforce.cluster.progress import record_lasting_failure
    from molt_flashreinforce.plugin import seams

    try:
        seams.check()
    except seams.UnsupportedMolt as error:
        record_lasting_failure(f"a Ray worker (pid {os.getpid()})", str(error))
        raise


def runtime_env_hook(runtime_env: dict | None) -> dict:
    import os

    from molt_flashreinforce.plugin.compat import ACCEPT_VARIABLE

    runtime_env = dict(runtime_env or {})
    existing = runtime_env.get("worker_process_setup_hook")
    if existing not in (None, SETUP_HOOK):
        raise ValueError(
            f"the job already sets worker_process_setup_hook={existing!r}; Ray runs only one. Call "
            f"{SETUP_HOOK} from your hook instead of using RAY_RUNTIME_ENV_HOOK."
        )
    runtime_env["worker_process_setup_hook"] = SETUP_HOOK
    if os.environ.get(ACCEPT_VARIABLE):
        runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), ACCEPT_VARIABLE: os.environ[ACCEPT_VARIABLE]}
    install_runtime_patches()
    return runtime_env
