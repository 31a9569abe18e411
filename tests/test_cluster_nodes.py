"""Ray across SLURM nodes, without Molt: `python -m molt_flashreinforce.cluster` goes through the same
`cluster.ray_nodes` code as every multi-node launch and rehearsal.

On the local cluster of `conftest.slurm` (four slurmd on this host): `srun --nodes=2` forms a
two-node Ray cluster, runs a task on each node and leaves no process behind, with each node's
logs in the run directory. The failures to join are each driven from one side with the SLURM
environment a task of a two-node allocation gets, so that the other side is truly absent: a
worker that never joins (the head stops at its join timeout naming the node), a head that never
comes up or is out of reach (the worker stops with one line), and a head on another Ray version
(a fake head record and a bare TCP listener stand in for it: one host cannot run two Ray
versions). The head also stops at once when a worker has refused."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from molt_flashreinforce.cluster.ray_nodes import HEAD_RECORD, versions

CHECK = [sys.executable, "-m", "molt_flashreinforce.cluster"]
RAY_PROGRAMS = ("raylet", "gcs_server")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ray_processes() -> list[str]:
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if process.info["name"] in RAY_PROGRAMS or any(f"/{name} " in f"{command} " for name in RAY_PROGRAMS):
            found.append(command[:120])
    return found


def task_env(slurm: dict[str, str], node: int, job_id: str) -> dict[str, str]:
    """What SLURM sets for the task of node n<node> of a two-node allocation n[1-2]."""
    return {**slurm, "SLURM_JOB_ID": job_id, "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "2",
            "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_PROCID": str(node - 1), "SLURM_NODEID": str(node - 1),
            "SLURMD_NODENAME": f"n{node}"}


@pytest.mark.slow
def test_srun_forms_a_two_node_ray_cluster_and_leaves_nothing_behind(slurm, tmp_path):
    done = subprocess.run(["srun", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1", *CHECK,
                           "--run-dir", str(tmp_path), "--ray-port", str(free_port()), "--join-timeout-s", "120"],
                          env=slurm, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "n1: a Ray task ran there" in done.stdout and "n2: a Ray task ran there" in done.stdout
    assert "cluster check passed: 2 nodes" in done.stdout
    (job_dir,) = (tmp_path / "cluster").iterdir()
    for node in ("n1", "n2"):
        assert "Ray runtime started" in (job_dir / node / "ray_start.log").read_text()
        assert list((job_dir / node / "ray_logs").glob("raylet*.out"))
    assert json.loads((job_dir / HEAD_RECORD).read_text())["state"] == "stopped"
    assert ray_processes() == []


def run_alone(slurm, node: int, run_dir: Path, port: int, timeout_s: float, job_id: str = "900"):
    started = time.monotonic()
    done = subprocess.run([*CHECK, "--run-dir", str(run_dir), "--ray-port", str(port), "--join-timeout-s", str(timeout_s)],
                          env=task_env(slurm, node, job_id), capture_output=True, text=True, timeout=180)
    return done, time.monotonic() - started


def one_error_line(done: subprocess.CompletedProcess) -> str:
    errors = [line for line in done.stderr.splitlines() if line.startswith("molt-flashreinforce: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return errors[0]


@pytest.mark.slow
def test_a_worker_that_never_joins_stops_the_head_at_the_join_timeout(slurm, tmp_path):
    done, took = run_alone(slurm, 1, tmp_path, free_port(), timeout_s=6)
    assert done.returncode == 1
    line = one_error_line(done)
    assert "node(s) n2 did not join the Ray cluster" in line and "within 6 s (cluster.join_timeout_s)" in line
    assert took < 60
    assert ray_processes() == []


def test_a_head_that_never_comes_up_stops_the_worker(slurm, tmp_path):
    done, took = run_alone(slurm, 2, tmp_path, free_port(), timeout_s=4)
    assert done.returncode == 1
    line = one_error_line(done)
    assert "the Ray head of job 900 at 127.0.0.1:" in line and "did not come up from n2 within 4 s" in line
    assert took < 30
    assert (tmp_path / "cluster" / "900" / "n2.error").read_text().strip() == line.removeprefix("molt-flashreinforce: error: ")


def write_head_record(run_dir: Path, port: int, **overrides) -> None:
    record = run_dir / "cluster" / "900" / HEAD_RECORD
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"job_id": "900", "address": f"127.0.0.1:{port}", "node": "n1", **versions(),
                                  "state": "up", **overrides}))


def test_a_head_out_of_reach_stops_the_worker(slurm, tmp_path):
    port = free_port()  # nothing listens there
    write_head_record(tmp_path, port)
    done, _ = run_alone(slurm, 2, tmp_path, port, timeout_s=4)
    assert done.returncode == 1
    assert "started but is out of reach from n2 within 4 s" in one_error_line(done)


def test_a_head_on_another_ray_version_is_refused_in_one_line(slurm, tmp_path):
    with socket.socket() as listener:  # the head's port answers; only its record tells the versions
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        write_head_record(tmp_path, port, ray="2.40.0", python="3.12.1")
        done, took = run_alone(slurm, 2, tmp_path, port, timeout_s=30)
    assert done.returncode == 1
    line = one_error_line(done)
    mine = versions()
    assert f"node n2 runs Python {mine['python']} and Ray {mine['ray']}, but the head (n1) runs Python 3.12.1 and Ray 2.40.0" in line
    assert "install the same Python and Ray on every node" in line
    assert took < 20  # refused at once, not at the join timeout


@pytest.mark.slow
def test_the_head_stops_at_once_when_a_worker_refused(slurm, tmp_path):
    # Stands in for a worker on another Python or Ray (this host has one of each): the line such a
    # worker writes, as test_a_head_on_another_ray_version_is_refused_in_one_line shows it does.
    refusal = tmp_path / "cluster" / "900" / "n2.error"
    refusal.parent.mkdir(parents=True)
    refusal.write_text("node n2 runs Python 3.12.1 and Ray 2.40.0, but the head (n1) runs ...\n")
    done, took = run_alone(slurm, 1, tmp_path, free_port(), timeout_s=120)
    assert done.returncode == 1
    assert "node n2 runs Python 3.12.1 and Ray 2.40.0" in one_error_line(done)
    assert took < 60  # far below the join timeout
    assert ray_processes() == []


def test_a_head_that_stopped_before_the_worker_joined_stops_it_at_once(slurm, tmp_path):
    port = free_port()
    write_head_record(tmp_path, port, state="stopped")  # as `heading` leaves it when preparing the job failed
    done, took = run_alone(slurm, 2, tmp_path, port, timeout_s=120)
    assert done.returncode == 1
    assert "the Ray head on n1 stopped before n2 joined" in one_error_line(done)
    assert took < 20
