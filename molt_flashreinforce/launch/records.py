"""What every run directory keeps about its launch, under `<run_dir>/launch/`.

    config.yaml        the resolved config (Hydra's own .hydra/ keeps the unresolved one)
    molt_command.sh    the rendered Molt command, shell-quoted and runnable
    environment.json   the launching environment; values of secret-looking names are redacted
    versions.json      Python, molt-rl, molt-flashreinforce and the main libraries
    git.json           commit and dirty flag of the working tree the launch ran from
    warnings.txt       what a real launch would still need (dry runs)
    wandb_run_id       the run's W&B id: every attempt (restart, requeue, rerun) continues that run
    attempts.json      each attempt: start, end, cause, the step it resumed from (cluster.supervisor)
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from molt_flashreinforce.launch.render import MoltCommand

RECORDS_SUBDIR = "launch"
RESOLVED_CONFIG = "config.yaml"  # also read by the report (report/placement.py)
WANDB_ID_FILE = "wandb_run_id"
_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL", "AUTH")
_VERSIONED_PACKAGES = (
    "molt-rl",
    "molt-flashreinforce",
    "torch",
    "ray",
    "vllm",
    "transformers",
    "hydra-core",
    "omegaconf",
    "nemo-automodel",
)


def redacted_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ if environ is None else environ)
    return {
        name: ("<redacted>" if any(marker in name.upper() for marker in _SECRET_MARKERS) else value)
        for name, value in sorted(environ.items())
    }


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for package in _VERSIONED_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def git_state(directory: Path) -> dict[str, object]:
    """Commit of the package's source tree (or of the launch directory), if it is a git checkout."""

    def git(*arguments: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *arguments], cwd=directory, capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def write_records(run_dir: Path, cfg: DictConfig, command: MoltCommand | None, warnings: list[str]) -> Path:
    records = run_dir / RECORDS_SUBDIR
    records.mkdir(parents=True, exist_ok=True)
    (records / RESOLVED_CONFIG).write_text(OmegaConf.to_yaml(cfg, resolve=True), encoding="utf-8")
    if command is not None:
        script = records / "molt_command.sh"
        script.write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + command.shell(sys.executable), encoding="utf-8")
        script.chmod(0o755)
    (records / "environment.json").write_text(json.dumps(redacted_environment(), indent=1) + "\n", encoding="utf-8")
    (records / "versions.json").write_text(json.dumps(package_versions(), indent=1) + "\n", encoding="utf-8")
    package_dir = Path(__file__).resolve().parents[2]
    (records / "git.json").write_text(json.dumps(git_state(package_dir), indent=1) + "\n", encoding="utf-8")
    (records / "warnings.txt").write_text("".join(f"{line}\n" for line in warnings), encoding="utf-8")
    return records


def wandb_resume_env(run_dir: Path) -> dict[str, str]:
    """WANDB_RUN_ID and WANDB_RESUME for Molt's `wandb.init` (Molt 0.2.1 has no flag for an id; wandb
    reads both from the environment): the id is made once per run directory and kept in its records."""
    path = run_dir / RECORDS_SUBDIR / WANDB_ID_FILE
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(4) + "\n")
    return {"WANDB_RUN_ID": path.read_text().strip(), "WANDB_RESUME": "allow"}
