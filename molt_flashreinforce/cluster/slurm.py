"""What a SLURM allocation tells a task: how many nodes, which one this is, where the Ray head runs.

`allocation(environ)` is None outside SLURM and on one-node allocations (Molt then starts its own
local Ray). On several nodes the task on the allocation's first node (SLURM_NODEID 0) leads:
it starts the Ray head and runs the job; the others join its cluster. Node names come from
SLURM's own `scontrol show hostnames`, and the head's address is the first node's `NodeAddr`
(its hostname on most clusters; an IP where `slurm.conf` sets one), so the workers reach it
whatever the node list looks like.

`job_id`, `restart_count`, `job_state` and `requeue` are what the supervisor asks SLURM when a
signal arrives (cluster.supervisor).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Callable, Mapping


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: tuple[str, ...]  # in SLURM's order; nodes[0] leads
    this_node: str
    head_address: str  # the first node's NodeAddr
    restart: int = 0  # times SLURM requeued the job before this run of it

    @property
    def is_head(self) -> bool:
        return self.this_node == self.nodes[0]

    @property
    def run_id(self) -> str:
        """This run of the job: a requeued job keeps its id, but its cluster is a new one."""
        return self.job_id if self.restart == 0 else f"{self.job_id}-requeue{self.restart}"


def hostnames(nodelist: str) -> list[str]:
    """The hosts of a SLURM node list such as `gpu[03-05,09]`, via SLURM's own expansion."""
    done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return done.stdout.split()


def node_address(name: str) -> str:
    """`NodeAddr` of a node as slurmctld knows it (the name itself where the node is not known)."""
    done = subprocess.run(["scontrol", "show", "node", name, "-o"], capture_output=True, text=True, check=False)
    fields = dict(field.partition("=")[::2] for field in done.stdout.split())
    return fields.get("NodeAddr") or name


def allocation(
    environ: Mapping[str, str],
    expand: Callable[[str], list[str]] = hostnames,
    address_of: Callable[[str], str] = node_address,
) -> Allocation | None:
    nodes = int(environ.get("SLURM_JOB_NUM_NODES", environ.get("SLURM_NNODES", "1")))
    if "SLURM_PROCID" not in environ or nodes <= 1:
        return None
    if int(environ.get("SLURM_NTASKS", nodes)) != nodes:
        raise RuntimeError(
            f"a multi-node Molt job needs exactly one task per node, got SLURM_NTASKS={environ.get('SLURM_NTASKS')} "
            f"on {nodes} nodes; set hydra.launcher.tasks_per_node=1 (or srun --ntasks-per-node=1)."
        )
    names = tuple(expand(environ["SLURM_JOB_NODELIST"]))
    this_node = environ.get("SLURMD_NODENAME") or names[int(environ.get("SLURM_NODEID", "0"))]
    return Allocation(job_id=environ.get("SLURM_JOB_ID", "0"), nodes=names, this_node=this_node,
                      head_address=address_of(names[0]), restart=restart_count(environ))


def job_id(environ: Mapping[str, str]) -> str | None:
    """This task's SLURM job (None outside SLURM)."""
    return environ.get("SLURM_JOB_ID") if "SLURM_PROCID" in environ else None


def restart_count(environ: Mapping[str, str]) -> int:
    """How many times SLURM has requeued this job so far."""
    return int(environ.get("SLURM_RESTART_COUNT", "0"))


def job_state(job: str) -> str | None:
    """`JobState` as slurmctld says now: RUNNING, or COMPLETING while a job it ends (scancel, the
    time limit) is still stopping; None when scontrol cannot say."""
    done = subprocess.run(["scontrol", "show", "job", job, "-o"], capture_output=True, text=True, check=False)
    fields = dict(field.partition("=")[::2] for field in done.stdout.split())
    return fields.get("JobState")


def requeue(job: str) -> None:
    """Put the job back in the queue; SLURM then ends this run of it (every task) and starts it
    again later, with the same job id, on whatever nodes it gets."""
    subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, check=True)
