"""Shared fixtures: a real SLURM cluster of several nodes on this host (scripts/local_slurm.sh).

`slurm` starts it on first use (a private munged, slurmctld and one slurmd per node n1..n4) and
stops it when the session ends. It needs Debian's slurm-wlm and munge (scripts/setup_slurm.sh
installs them where the tests run as root with apt-get, as CI does) and root (slurmd runs jobs as
their user); elsewhere the tests that use it skip and say why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SBIN = "/usr/sbin"
NODES = 4  # the MoE placement's node count; every node shares this host's cores
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")


def slurm_missing() -> str | None:
    absent = [p for p in PROGRAMS if shutil.which(p, path=f"{os.environ.get('PATH', '')}:{SBIN}") is None]
    if absent:
        return (f"SLURM is not installed here ({', '.join(absent)} missing); scripts/setup_slurm.sh installs "
                "Debian's slurm-wlm and munge where the tests run as root with apt-get")
    if os.geteuid() != 0:
        return "the local SLURM cluster runs slurmd as root (it starts jobs as their user); run the tests as root"
    return None


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """Environment for SLURM's clients against the running cluster of NODES nodes."""
    reason = slurm_missing()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm")
    script = str(REPO / "scripts" / "local_slurm.sh")
    up = subprocess.run(["bash", script, "up", str(root), str(NODES)], capture_output=True, text=True, timeout=120)
    if up.returncode != 0:
        pytest.fail(f"the local SLURM cluster did not start:\n{up.stdout}\n{up.stderr}")
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}:{SBIN}"}
    try:
        yield env
    finally:
        subprocess.run(["bash", script, "down", str(root)], timeout=120)
