"""A rendezvous port lost to another process ends the attempt, not the run.

Molt picks the ports of its process groups by binding port 0 and closing the socket at once
(`BaseDistributedActor._get_free_port` for the trainer's group, the policy actor's weight-sync
group); torch binds the port again only when the group starts, and in between any process on the
node that asks the kernel for a free port (vLLM's engine, Ray's workers) may be given the same one.
torch then raises `DistNetworkError` EADDRINUSE, also before the first optimizer step, where a fault
of Molt's own would not be restarted (cluster/supervisor.py). A new attempt picks new ports, so
`record(error, progress_dir)` in Molt's driver records this one as a fault that a restart mends,
and prints its line; any other error is left alone.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from molt_flashreinforce.cluster.progress import failure_line, record_failure, reported_step, this_node

ADDRESS_IN_USE = "EADDRINUSE"
# The head of a Ray task error's text: "ray::PolicyModelActor.init_model_from_pretrained() (pid=9252, ip=10.0.0.7, ...)"
RAY_TASK = re.compile(r"ray::([\w.]+)\(\)\S* \(pid=\d+, ip=([^,)]+)")


def lost_port(error: BaseException) -> str | None:
    """The port named by a `DistNetworkError` EADDRINUSE in `error` or its cause (a Ray task's
    error carries the worker's as `cause`), else None."""
    from torch.distributed import DistNetworkError

    for candidate in (error, getattr(error, "cause", None), error.__cause__):
        if isinstance(candidate, DistNetworkError) and ADDRESS_IN_USE in str(candidate):
            port = re.search(r"port: (\d+)", str(candidate))
            return port.group(1) if port else "?"
    return None


def record(error: BaseException, progress_dir: str | None) -> bool:
    """When `error` is a lost rendezvous port: record the attempt's fault (under a supervisor) and
    print its line. True when it was one."""
    port = lost_port(error)
    if port is None:
        return False
    where = Path(progress_dir) if progress_dir else None
    task = RAY_TASK.search(str(error))  # Ray's error, which keeps only its text, names the method and node
    fault = {"what": task.group(1) if task else "Molt's driver",
             "node": task.group(2) if task else this_node(),
             "step": reported_step(where),
             "cause": f"its process group's port {port} was taken by another process between Molt choosing it "
                      "and binding it (a port race); a new attempt chooses new ports",
             "code_fault": False}
    if where is not None:
        fault = record_failure(where, fault)
    print(failure_line(fault), file=sys.stderr, flush=True)
    return True
