"""The Molt plugin: FlashREINFORCE registered where Molt computes advantages and losses.

    register()                  idempotent; Molt registries + the PolicyTrainer patch, this process
    build_policy_loss(algo)     the Molt loss module for a Hydra `algo` node (local backend)
    policy_loss_from_args(args) the loss a Molt PolicyModelActor builds from parsed Molt args
    SETUP_HOOK                  Ray worker_process_setup_hook: in every worker, checks Molt, calls
                                register() and installs the runtime hooks (plugin/ray_hooks.py)

Molt's internals are touched only by `seams` (the tested contract, the wrappers, the hooks).
Everything that imports Molt is imported lazily, so `molt_flashreinforce.plugin.cli_flags` and the
hooks' names are usable where Molt's heavy imports are not wanted.
"""

from __future__ import annotations

from molt_flashreinforce.plugin.ray_hooks import SETUP_HOOK, runtime_env_hook, setup_worker


def register() -> None:
    from molt_flashreinforce.plugin.registry import register as _register

    _register()


def build_policy_loss(algo):
    register()
    from molt_flashreinforce.plugin.policy_loss import build_policy_loss as _build

    return _build(algo)


def policy_loss_from_args(args):
    register()
    from molt_flashreinforce.plugin.policy_loss import policy_loss_from_args as _from_args

    return _from_args(args)


__all__ = ["SETUP_HOOK", "build_policy_loss", "policy_loss_from_args", "register", "runtime_env_hook",
           "setup_worker"]
