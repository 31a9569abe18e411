"""`python -m molt_flashreinforce.launch.molt_main <Molt train_rl_ray flags>`: Molt's entry point.

Runs Molt's own parser, validation and `train(args)` unchanged (see `molt_cli`), except that
`flashreinforce` is accepted by its `choices` and the `--flashreinforce.*` flags exist. Before
`train(args)` it builds in this process the `PolicyLoss` the GPU actors will build, so a bad
combination fails here, and it starts Ray itself with our worker setup hook, so every Ray worker
registers the plugin and installs the runtime patches before it loads an actor (plugin/ray_hooks.py).

While `train(args)` runs, `cluster.actor_watch` ends this process within seconds of any of the
run's actors or nodes dying (Molt itself would go on dropping rollouts for minutes), naming what
died; a process group whose port another process took first is recorded as a fault that a restart
mends (`cluster.port_race`). When MOLT_FLASHREINFORCE_ACTOR_MAP names a file, it receives, right
after `train(args)`, which node hosted which of Molt's actors (`cluster.actor_map`).

Environment variables named in MOLT_FLASHREINFORCE_WORKER_ENV (comma-separated, e.g.
MAX_AGENT_TURNS,ALFWORLD_DATA) are forwarded to every worker, also when Ray attaches to an
existing cluster (SLURM) whose workers did not inherit this process's environment.
"""

from __future__ import annotations

import os
import sys
from argparse import Namespace
from pathlib import Path
from typing import Callable

from molt_flashreinforce.cluster import actor_map, actor_watch, port_race
from molt_flashreinforce.launch.render import WORKER_ENV_VARIABLE
from molt_flashreinforce.plugin.compat import ACCEPT_VARIABLE, UnsupportedMolt
from molt_flashreinforce.cluster.progress import PROGRESS_DIR_VARIABLE

ACTOR_MAP_VARIABLE = "MOLT_FLASHREINFORCE_ACTOR_MAP"
# What the supervisor (cluster.supervisor) sets for an attempt, which the workers need too: where
# they report progress, and the W&B run that every attempt continues; and a user's acceptance of
# an untested Molt, which every worker checks again.
SUPERVISOR_ENV = (PROGRESS_DIR_VARIABLE, "WANDB_RUN_ID", "WANDB_RESUME", ACCEPT_VARIABLE)
REFUSED_STATUS = 2  # the driver refused this Molt (untested, or not as tested) before any work


def worker_env_vars(environ: dict[str, str]) -> dict[str, str]:
    from molt_flashreinforce.plugin.seams import ray_runtime_env_vars

    env_vars = ray_runtime_env_vars()
    for name in [*filter(None, environ.get(WORKER_ENV_VARIABLE, "").split(",")), *SUPERVISOR_ENV]:
        if environ.get(name):
            env_vars[name] = environ[name]
    return env_vars


def main(argv: list[str] | None = None, *, setup_hook: str | None = None, ray_options: dict | None = None,
         adjust_args: Callable[[Namespace], None] | None = None) -> None:
    """Parse and validate Molt's flags, start Ray with `setup_hook` in every worker, run `train`.

    The CPU rehearsal passes its own hook (stand-ins, then the plugin's), Ray options, and
    `adjust_args`, its edit of the parsed flags."""
    from molt_flashreinforce.launch.molt_cli import parse_and_validate
    from molt_flashreinforce.plugin import SETUP_HOOK, policy_loss_from_args
    from molt_flashreinforce.plugin.ray_hooks import install_runtime_patches

    from molt_flashreinforce.plugin import seams

    try:
        seams.check()
    except UnsupportedMolt as error:
        print(f"molt-flashreinforce: {error}", file=sys.stderr, flush=True)
        sys.exit(REFUSED_STATUS)
    args = parse_and_validate(sys.argv[1:] if argv is None else argv)
    if adjust_args is not None:
        adjust_args(args)
    policy_loss_from_args(args)
    install_runtime_patches()  # before train() ships Molt's actor classes to their workers

    import ray
    from molt.cli.train_rl_ray import train

    options = dict(ray_options or {})
    env_vars = {**worker_env_vars(dict(os.environ)), **options.pop("env_vars", {})}
    # RAY_ADDRESS: the cluster our multi-node launch formed. Otherwise a Ray of this job's own: with no
    # address, ray.init would join whatever cluster the host's address file last named (a
    # finished job's stale one, or another user's `ray start`).
    ray.init(address=os.environ.get("RAY_ADDRESS", "local"),
             runtime_env={"env_vars": env_vars, "worker_process_setup_hook": setup_hook or SETUP_HOOK}, **options)
    watch = actor_watch.start(os.environ.get(PROGRESS_DIR_VARIABLE))
    lost = (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError)
    try:
        train(args)
    except lost:
        watch.name_the_fault()  # the dead actor or node behind Molt's error ends the driver with its line
        raise
    except Exception as error:
        port_race.record(error, os.environ.get(PROGRESS_DIR_VARIABLE))  # a restart mends it
        raise
    else:
        watch.stop()
        if os.environ.get(ACTOR_MAP_VARIABLE):
            actor_map.write(Path(os.environ[ACTOR_MAP_VARIABLE]))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
