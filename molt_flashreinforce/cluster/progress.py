"""The progress files: how Molt's workers tell the supervisor how a run goes, and how it asks them
for a checkpoint.

When MOLT_FLASHREINFORCE_PROGRESS_DIR names a directory (the supervisor sets it for every attempt
and forwards it to the workers), the workers (plugin/progress.py) keep in it:

    step.json             {"step", "time"}: the optimizer step that just ended
    rollout               touched when a rollout group finished (at most once a second)
    checkpoint_done.json  {"id", "step"}: the answer to a checkpoint request, with the step saved

and the supervisor writes `checkpoint_request` ({"id", "why"}). `failure.json` ({"what", "node",
"step", "cause", "code_fault", and "every_attempt" for a fault no restart can mend}) names the fault that ends an attempt: a dead actor or node (the
driver's watch, cluster/actor_watch.py) or a worker that refused to run (a Molt that drifted from
the tested one, plugin/ray_hooks.py; an engine whose refit landed other weights,
rehearsal/vllm_actor.py: `record_lasting_failure`); the first fault written stands (`record_failure`). Files
are replaced atomically (`write_json`), so a reader on another node never sees half of one.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

PROGRESS_DIR_VARIABLE = "MOLT_FLASHREINFORCE_PROGRESS_DIR"
STEP_FILE = "step.json"
ROLLOUT_FILE = "rollout"
REQUEST_FILE = "checkpoint_request"
DONE_FILE = "checkpoint_done.json"
FAILURE_FILE = "failure.json"


def progress_dir() -> Path | None:
    value = os.environ.get(PROGRESS_DIR_VARIABLE)
    return Path(value) if value else None


def write_json(path: Path, fields) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(fields))
    partial.replace(path)


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def reported_step(where: Path | None) -> int:
    """The last step the trainer reported (0 before the first, or without a progress directory)."""
    record = read_json(where / STEP_FILE) if where is not None else None
    return int(record["step"]) if record else 0


def this_node() -> str:
    """This node's name as SLURM knows it, else its host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def record_failure(where: Path, fault: dict) -> dict:
    """Write `fault` as the attempt's failure unless one was written first; the one that stands."""
    path = where / FAILURE_FILE
    first = read_json(path)
    if first is not None:
        return first
    write_json(path, fault)
    return fault


def record_lasting_failure(what: str, cause: str) -> None:
    """In a worker of a supervised run (else nothing): record a fault of the run's own code or set-up
    that no restart can mend, so that the attempt ends in `cause` and the run is not restarted."""
    where = progress_dir()
    if where is not None:
        record_failure(where, {"what": what, "step": reported_step(where),
                               "node": this_node(),
                               "cause": cause, "code_fault": True, "every_attempt": True})


def failure_line(fault: dict) -> str:
    return f"molt-flashreinforce: {fault['what']} died on node {fault['node']} at step {fault['step']}: {fault['cause']}"


def pending_request(where: Path) -> str | None:
    """The id of a checkpoint request not answered yet."""
    request = read_json(where / REQUEST_FILE)
    if request is None:
        return None
    done = read_json(where / DONE_FILE) or {}
    return None if done.get("id") == request.get("id") else request.get("id")
