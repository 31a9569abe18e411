"""Which backend runs a composed config, after it is validated.

    validate(cfg)        # every bad value, as one `LaunchError` line, before any work
    run(cfg, run_dir)    # a rehearsal, the CPU backend, or a Molt launch, into run_dir

It sits above the three it chooses between (`rehearsal`, `local`, `launch`) so that none of them
imports another to be chosen.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig

from molt_flashreinforce.launch.errors import LaunchError


def validate(cfg: DictConfig) -> None:
    """The launcher's checks (launch/validate.py) and, for backend=local, the CPU backend's own."""
    from molt_flashreinforce.launch.validate import validate as validate_launch

    validate_launch(cfg)
    if cfg.backend == "local":
        from molt_flashreinforce.local.config import LocalConfigError, check

        try:
            check(cfg)
        except LocalConfigError as error:
            raise LaunchError(str(error)) from None


def allocation_of(cfg: DictConfig):
    """This task's multi-node SLURM allocation (None: no SLURM, one node, or a dry run)."""
    from molt_flashreinforce.cluster import slurm

    return None if cfg.dry_run else slurm.allocation(os.environ)


def run(cfg: DictConfig, run_dir: Path) -> None:
    """Launch one composed job whose outputs go to `run_dir`; bad input raises `LaunchError` first."""
    validate(cfg)
    if cfg.rehearsal.mode is not None:  # cpu or gpu (validated above)
        from molt_flashreinforce.rehearsal.run import run_rehearsal

        summary = run_rehearsal(cfg, run_dir, allocation_of(cfg))
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
    from molt_flashreinforce.launch.job import launch

    launch(cfg, run_dir, allocation_of(cfg))
