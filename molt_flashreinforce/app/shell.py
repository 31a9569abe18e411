"""The `molt-flashreinforce` command line (also `python -m molt_flashreinforce`): the shell around
`app.dispatch.run`.

    molt-flashreinforce experiment=math_qwen2p5_1p5b algo=flashreinforce dry_run=true
    molt-flashreinforce -m experiment=math_qwen2p5_1p5b algo.delta=1e-3,3e-3,5e-3

The run directory is Hydra's output directory; `app.dispatch` chooses what runs there. Under `-m`
every job gets its own directory and child process; a failing job raises in its own Hydra job,
the others still run, and Hydra reports the failure at the end.

Keys under `molt.` are open: `molt.<any Molt flag>=value` works on the command line without
Hydra's `+` prefix (the app adds `++` before Hydra parses the overrides).

Bad input (launch/validate.py) is refused before any work: one line on stderr naming the key, the
value and the fix, exit status 2, no traceback (set MOLT_FLASHREINFORCE_DEBUG=1 for one). Unknown
keys and options are caught on the command line, before Hydra composes; bad values at the start of
`run`, before the run directory is written. A refused single run removes the directory Hydra made
for it when that holds nothing but Hydra's own `.hydra/` and log; a refused job of a sweep keeps its
directory, with the reason in its log, and the other jobs still run.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from molt_flashreinforce import conf
from molt_flashreinforce.app.dispatch import run
from molt_flashreinforce.cluster.errors import ClusterError
from molt_flashreinforce.launch.errors import LaunchError
from molt_flashreinforce.plugin.compat import UnsupportedMolt

PROG = "molt-flashreinforce"
DEBUG_ENV = "MOLT_FLASHREINFORCE_DEBUG"  # =1: a refusal also prints its traceback
_MOLT_OVERRIDE = re.compile(r"^molt\.[^=~+]+=")
# Jobs of an in-process sweep that were refused; main() exits 2 after the sweep when there are any.
_refused_jobs: list[Path] = []
_main_pid: int | None = None


def open_molt_overrides(argv: list[str]) -> list[str]:
    """`molt.a.b=v` -> `++molt.a.b=v`: add-or-override, since Molt has more flags than the config sets."""
    return [f"++{arg}" if _MOLT_OVERRIDE.match(arg) else arg for arg in argv]


def plain_override_dirname(dirname: str) -> str:
    """Hydra's override_dirname without the `+`/`++` prefixes, for readable sweep directories."""
    return ",".join(item.lstrip("+") for item in dirname.split(","))


OmegaConf.register_new_resolver("plain_override_dirname", plain_override_dirname, replace=True)


class RefusedJob(CompactHydraException):
    """A sweep job refused in its own process (submitit): after the sweep Hydra prints this message
    as it is, without a traceback, and exits non-zero."""


def print_refusal(error: Exception, where: str = "") -> None:
    if os.environ.get(DEBUG_ENV) == "1":
        traceback.print_exception(error)
    print(f"{PROG}: error: {where}{error}", file=sys.stderr, flush=True)


def _log_to_files(message: str, exc_info: bool = False) -> None:
    """Into the job's own log file only (the console gets the message once, from Hydra or from us)."""
    logger = logging.getLogger("molt_flashreinforce")
    record = logger.makeRecord(logger.name, logging.ERROR, __file__, 0, message, (),
                               sys.exc_info() if exc_info else None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def remove_unused_run_dir(run_dir: Path, launch_dir: Path) -> None:
    """Remove a run directory that holds only what Hydra wrote before the job (.hydra/ and its log),
    then the parents that this leaves empty, up to the launch directory."""
    launch_dir = launch_dir.resolve()
    if run_dir.resolve() in (launch_dir, *launch_dir.parents) or not run_dir.is_dir() or any(
        not (entry.name == ".hydra" and entry.is_dir()) and not (entry.suffix == ".log" and entry.is_file())
        for entry in run_dir.iterdir()
    ):
        return
    shutil.rmtree(run_dir)
    for parent in run_dir.resolve().parents:
        if parent == launch_dir or launch_dir not in parent.parents or any(parent.iterdir()):
            break
        parent.rmdir()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        run(cfg, run_dir)
    except ClusterError as error:
        # A cluster that could not form (a node that never joined, a head out of reach): one line, and
        # the run directory keeps whatever the nodes wrote.
        _log_to_files(f"cluster: {error}")
        print(f"{PROG}: error: {error}", file=sys.stderr, flush=True)
        if hydra_cfg.mode == RunMode.RUN:
            sys.exit(1)
        raise RefusedJob(f"{PROG}: error: {error}") from None
    except (LaunchError, UnsupportedMolt) as error:  # bad input, or a Molt other than the one tested
        # Into the job's log file, so a refused job of a sweep keeps its reason.
        _log_to_files(f"refused: {error}")
        if hydra_cfg.mode == RunMode.RUN:
            print_refusal(error)
            remove_unused_run_dir(run_dir, Path(hydra_cfg.runtime.cwd))
            sys.exit(2)
        if os.getpid() == _main_pid:  # a sweep running its jobs in this process: let the others run
            print_refusal(error, where=f"job {run_dir.name}: ")
            _refused_jobs.append(run_dir)
            return
        print_refusal(error)  # into the job's own SLURM/submitit log
        raise RefusedJob(f"{PROG}: error: {error}") from None  # its launcher records the failure
    except Exception:
        _log_to_files("job failed", exc_info=True)  # Hydra prints it on the console
        raise


def usage() -> str:
    """Shown for --help without an experiment (Hydra's own help needs a composable config)."""
    return (
        "usage: molt-flashreinforce experiment=<name> [algo=flashreinforce|grpo] [key=value ...] [-m]\n"
        f"experiments: {', '.join(conf.experiments())}\n"
        "Full config and groups: molt-flashreinforce experiment=<name> --help\n"
        "Dry run (no Ray, no GPU): molt-flashreinforce experiment=<name> dry_run=true\n"
    )


def _check_command_line(arguments: list[str]) -> None:
    """Unknown keys and options, before Hydra composes (it would advise adding them with `+`)."""
    from hydra._internal.utils import get_args_parser

    from molt_flashreinforce.launch.validate import check_overrides

    args, _ = get_args_parser().parse_known_args(arguments)
    # Hydra's own modes (help, --cfg, --info, other config sources) report on the config themselves.
    if args.help or args.hydra_help or args.cfg or args.info or args.shell_completion or args.config_path \
            or args.config_name or args.config_dir or args.experimental_rerun:
        return
    check_overrides(args.overrides, multirun=args.multirun)


def main() -> None:
    global _main_pid
    arguments = sys.argv[1:]
    if {"--help", "-h"} & set(arguments) and not any(a.startswith("experiment=") for a in arguments):
        print(usage(), end="")
        return
    arguments = open_molt_overrides(arguments)
    try:
        _check_command_line(arguments)
    except LaunchError as error:
        print_refusal(error)
        sys.exit(2)
    sys.argv = [sys.argv[0], *arguments]
    _main_pid = os.getpid()
    _hydra_main()
    if _refused_jobs:
        print(f"{PROG}: {len(_refused_jobs)} job(s) of the sweep refused (reasons above, and in each job's "
              f"log); the other jobs ran.", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
