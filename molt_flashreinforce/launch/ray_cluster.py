"""A Ray cluster over a multi-node SLURM allocation, for the `molt_slurm` Hydra launcher.

submitit runs the Hydra job once per node (one task per node). On one node nothing is needed:
Molt's process starts a local Ray. On several nodes:

* task 0 (on the allocation's first node) is the head: `ray start --head`, wait until every node
  has joined, run Molt with RAY_ADDRESS pointing at the cluster, `ray stop` at the end;
* every other task runs `ray start --address <head> --block`, which returns when the head stops.

`slurm_role(environ)` decides; it returns None outside SLURM and on single-node allocations.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

RAY_PORT = 6379
JOIN_TIMEOUT_S = 600


@dataclass(frozen=True)
class SlurmRole:
    is_head: bool
    head_host: str
    nodes: int

    @property
    def address(self) -> str:
        return f"{self.head_host}:{RAY_PORT}"


def first_hostname(nodelist: str) -> str:
    """The first host of a SLURM node list such as `gpu[03-05,09]`, via SLURM's own expansion."""
    done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return done.stdout.split()[0]


def slurm_role(
    environ: Mapping[str, str], resolve_first_host: Callable[[str], str] = first_hostname
) -> SlurmRole | None:
    nodes = int(environ.get("SLURM_JOB_NUM_NODES", environ.get("SLURM_NNODES", "1")))
    if "SLURM_PROCID" not in environ or nodes <= 1:
        return None
    if int(environ.get("SLURM_NTASKS", nodes)) != nodes:
        raise RuntimeError(
            f"a multi-node Molt job needs exactly one task per node, got SLURM_NTASKS={environ.get('SLURM_NTASKS')} "
            f"on {nodes} nodes; set hydra.launcher.tasks_per_node=1."
        )
    head = resolve_first_host(environ["SLURM_JOB_NODELIST"])
    return SlurmRole(is_head=environ["SLURM_PROCID"] == "0", head_host=head, nodes=nodes)


def _ray(*arguments: str) -> None:
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", *arguments], check=True)


def _alive_nodes(address: str) -> int:
    probe = "import ray; ray.init(address=%r, log_to_driver=False); print(sum(n['Alive'] for n in ray.nodes()))"
    done = subprocess.run([sys.executable, "-c", probe % address], capture_output=True, text=True, check=False)
    return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout.strip() else 0


def join_as_worker(role: SlurmRole) -> None:
    """Block as a Ray worker node until the head stops the cluster."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while True:  # the head may not be up yet
        try:
            _ray("start", f"--address={role.address}", "--block")
            return
        except subprocess.CalledProcessError:
            if time.monotonic() > deadline:
                raise
            time.sleep(10)


@contextlib.contextmanager
def head_node(role: SlurmRole) -> Iterator[dict[str, str]]:
    """Start the head, wait for every node, yield the env that points Molt at the cluster."""
    _ray("start", "--head", f"--port={RAY_PORT}", "--disable-usage-stats")
    try:
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while (alive := _alive_nodes(role.address)) < role.nodes:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {alive} of {role.nodes} nodes joined the Ray cluster in {JOIN_TIMEOUT_S} s")
            time.sleep(5)
        yield {"RAY_ADDRESS": role.address}
    finally:
        _ray("stop")
