"""The `molt-flashreinforce` Hydra app (also `python -m molt_flashreinforce`).

    molt-flashreinforce experiment=math_qwen2p5_1p5b algo=flashreinforce dry_run=true
    molt-flashreinforce -m experiment=math_qwen2p5_1p5b algo.delta=1e-3,3e-3,5e-3

The run directory is Hydra's output directory. `backend=local` hands the composed config to the
CPU backend (`molt_flashreinforce.local.run`); `backend=molt` prepares the Molt job (checks,
rendering, Molt's own validation, run records) and, unless `dry_run=true`, runs it in a child
process. Under `-m` every job gets its own directory and child process; a failing job raises in
its own Hydra job, the others still run, and Hydra reports the failure at the end.

Keys under `molt.` are open: `molt.<any Molt flag>=value` works on the command line without
Hydra's `+` prefix (the app adds `++` before Hydra parses the overrides).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

_MOLT_OVERRIDE = re.compile(r"^molt\.[^=~+]+=")


def open_molt_overrides(argv: list[str]) -> list[str]:
    """`molt.a.b=v` -> `++molt.a.b=v`: add-or-override, since Molt has more flags than the config sets."""
    return [f"++{arg}" if _MOLT_OVERRIDE.match(arg) else arg for arg in argv]


def plain_override_dirname(dirname: str) -> str:
    """Hydra's override_dirname without the `+`/`++` prefixes, for readable sweep directories."""
    return ",".join(item.lstrip("+") for item in dirname.split(","))


OmegaConf.register_new_resolver("plain_override_dirname", plain_override_dirname, replace=True)


def run(cfg: DictConfig, run_dir: Path) -> None:
    """Launch one composed job whose outputs go to `run_dir`."""
    if cfg.rehearsal.mode == "cpu":
        if cfg.backend != "molt":
            from molt_flashreinforce.launch.errors import LaunchError

            raise LaunchError(
                f"rehearsal=cpu rehearses a Molt (GPU) job, but backend={cfg.backend}; experiment=tiny already runs on the CPU."
            )
        from molt_flashreinforce.rehearsal.run import run_rehearsal

        summary = run_rehearsal(cfg, run_dir)
        if summary is not None:
            print("\n".join(summary.lines()))
        return
    if cfg.backend == "local":
        from molt_flashreinforce import local
        from molt_flashreinforce.launch.records import write_records

        write_records(run_dir, cfg, command=None, warnings=[])
        if cfg.dry_run:
            print("dry_run=true: not training (backend=local).")
            return
        local.run(cfg, run_dir)
        return
    if cfg.backend != "molt":
        from molt_flashreinforce.launch.errors import LaunchError

        raise LaunchError(f"backend={cfg.backend!r} is unknown; use backend=molt (GPU) or backend=local (CPU).")

    from molt_flashreinforce.launch import ray_cluster
    from molt_flashreinforce.launch.job import prepare_molt_job, run_molt_job

    role = None if cfg.dry_run else ray_cluster.slurm_role(os.environ)
    if role is not None and not role.is_head:
        ray_cluster.join_as_worker(role)  # the head node's task prepares and runs the job
        return
    job = prepare_molt_job(cfg, run_dir)
    if job.molt_messages.strip():
        print(f"Molt's validation said:\n{job.molt_messages.rstrip()}")
    for warning in job.warnings:
        print(f"WARNING: a real launch needs: {warning}")
    print(f"Molt command ({run_dir / 'launch' / 'molt_command.sh'}):\n{job.command.shell()}")
    if cfg.dry_run:
        print("dry_run=true: not starting Ray.")
        return
    with ray_cluster.head_node(role) if role is not None else contextlib.nullcontext({}) as cluster_env:
        run_molt_job(job, extra_env=cluster_env)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        run(cfg, Path(HydraConfig.get().runtime.output_dir))
    except Exception:
        # Into the job's own log file, so a failed job of a sweep keeps its reason.
        logging.getLogger("molt_flashreinforce").exception("job failed")
        raise


def usage() -> str:
    """Shown for --help without an experiment (Hydra's own help needs a composable config)."""
    from importlib import resources

    folder = resources.files("molt_flashreinforce.conf") / "experiment"
    experiments = sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))
    return (
        "usage: molt-flashreinforce experiment=<name> [algo=flashreinforce|grpo] [key=value ...] [-m]\n"
        f"experiments: {', '.join(experiments)}\n"
        "Full config and groups: molt-flashreinforce experiment=<name> --help\n"
        "Dry run (no Ray, no GPU): molt-flashreinforce experiment=<name> dry_run=true\n"
    )


def main() -> None:
    arguments = sys.argv[1:]
    if {"--help", "-h"} & set(arguments) and not any(a.startswith("experiment=") for a in arguments):
        print(usage(), end="")
        return
    sys.argv = [sys.argv[0], *open_molt_overrides(arguments)]
    _hydra_main()


if __name__ == "__main__":
    main()
