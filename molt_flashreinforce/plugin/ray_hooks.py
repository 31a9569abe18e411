"""Ray hooks that make the plugin active in every Molt worker process.

Molt computes advantages in its `TrainingActor` and the loss in each `PolicyModelActor`, both Ray
actors in processes of their own, so registering in the driver changes nothing there.

* `setup_worker`: Ray's `worker_process_setup_hook`; every worker runs it at start-up, before it
  deserialises an actor or a task. It registers the plugin, installs the runtime patches
  (`install_runtime_patches`) and, under the supervisor, leaves SLURM's signals to it
  (plugin/progress.py). Our launcher passes it to `ray.init`.
* `runtime_env_hook`: for `RAY_RUNTIME_ENV_HOOK=molt_flashreinforce.plugin.ray_hooks.runtime_env_hook`
  with the stock `python -m molt.cli.train_rl_ray`: Ray calls it inside Molt's own `ray.init` and it
  adds the setup hook to the job's runtime environment, and installs the runtime patches in the
  driver, where Molt's actor classes are shipped from. (Ray skips this hook under `uv run`.)
"""

from __future__ import annotations

SETUP_HOOK = "molt_flashreinforce.plugin.ray_hooks.setup_worker"


def install_runtime_patches() -> None:
    """The patches of Molt's runtime classes, in this process (idempotent): the policy-lag probe and
    bound, the prompts that carry over a resume (plugin/carryover.py) and the progress reports
    (plugin/progress.py)."""
    from molt_flashreinforce.plugin import carryover, lag_bound, policy_lag, progress

    policy_lag.install()
    carryover.install()  # inside the bound's collection, which may swap the finished rollout handed over
    lag_bound.install()  # wraps the probe's train_step: the board is told of a version after the probe's clock
    progress.install()


def setup_worker() -> None:
    from molt_flashreinforce.plugin.progress import defer_slurm_signals
    from molt_flashreinforce.plugin.registry import register

    register()
    install_runtime_patches()
    defer_slurm_signals()


def runtime_env_hook(runtime_env: dict | None) -> dict:
    runtime_env = dict(runtime_env or {})
    existing = runtime_env.get("worker_process_setup_hook")
    if existing not in (None, SETUP_HOOK):
        raise ValueError(
            f"the job already sets worker_process_setup_hook={existing!r}; Ray runs only one. Call "
            f"{SETUP_HOOK} from your hook instead of using RAY_RUNTIME_ENV_HOOK."
        )
    runtime_env["worker_process_setup_hook"] = SETUP_HOOK
    install_runtime_patches()
    return runtime_env
