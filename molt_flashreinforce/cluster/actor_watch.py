"""A dead actor or node ends the run within seconds, with one line naming it.

Molt 0.2.1 does not notice a dead rollout engine: its agent runners drop every rollout sent to
it ("dropping failed rollout") for minutes, until a refit finally raises `ActorDiedError`. A
lost node is the same for each actor it hosted. `start(progress_dir)` runs a thread in Molt's
driver process that reads Ray's GCS every `POLL_S` seconds; the first actor of this job found
dead by something other than an orderly end (its worker process died, its node died, it ran
out of memory, its constructor or runtime environment failed), or the first node that was alive and is no longer,
makes it

* print `molt-flashreinforce: <what> died on node <node> at step <step>: <cause>` on stderr,
* write the same as `failure.json` into the progress directory (the supervisor's record; a record
  a worker wrote first, cluster/progress.py, stands and is the line printed), and
* end the driver at once with `EXIT_STATUS` (Ray then ends the job's actors everywhere).

`stop()` ends the watch before Molt tears its actors down itself. When Molt raises first (it may
see an actor on a lost node as unavailable before Ray's GCS declares the node dead),
`name_the_fault(grace_s)` keeps watching that long, so that the line still names what died; with
nothing found, Molt's own error stands. The step is the last one the trainer reported
(cluster/progress.py), 0 before the first.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from molt_flashreinforce.cluster.actor_map import node_names
from molt_flashreinforce.cluster.progress import failure_line, record_failure, reported_step

POLL_S = 2.0
EXIT_STATUS = 75  # the driver's status when the watch ended it
# Ray's GCS declares a node dead after its health checks fail (5 x 3 s by default): a margin above.
FAULT_GRACE_S = 30.0
# ActorDiedErrorContext reasons that mean a fault, not an end someone asked for (ray.kill, out of
# scope) or the consequence of another death (its owner's), which is reported itself.
FAULT_REASONS = {"WORKER_DIED": "its worker process died", "NODE_DIED": "its node died"}
CONSTRUCTOR_RAISED = "its constructor raised"
RUNTIME_ENV_FAILED = "its runtime environment could not be set up"
# Faults of the run's own code or config: they come back at every attempt that gets as far.
CODE_FAULTS = {CONSTRUCTOR_RAISED, RUNTIME_ENV_FAILED}


def actor_fault(actor: dict) -> str | None:
    """Why a dead actor of the GCS actor table died, when that was a fault (None otherwise)."""
    if actor.get("State") != "DEAD" or actor.get("DeathCause") is None:
        return None
    cause = actor["DeathCause"]
    if cause.HasField("oom_context"):
        return "it ran out of memory"
    if cause.HasField("creation_task_failure_context"):
        return CONSTRUCTOR_RAISED
    if cause.HasField("runtime_env_failed_context"):
        return RUNTIME_ENV_FAILED
    if not cause.HasField("actor_died_error_context"):
        return None
    context = cause.actor_died_error_context
    reason = FAULT_REASONS.get(type(context).Reason.Name(context.reason))
    return f"{reason} (pid {context.pid})" if reason else None


def find_fault(actors: list[dict], nodes: list[dict], job_id: str, seen_alive: dict[str, str]) -> dict | None:
    """The first fault among this job's actors and the nodes seen alive before (node id -> the name
    it had then: a dead node's entry no longer lists its resources), as a record."""
    names = {**node_names(nodes), **seen_alive}
    for actor in actors:
        if actor.get("JobID") != job_id:
            continue
        cause = actor_fault(actor)
        if cause:
            node_id = actor["Address"]["NodeID"]
            return {"what": f"actor {actor['ActorClassName']}", "node": names.get(node_id, node_id), "cause": cause,
                    "code_fault": cause in CODE_FAULTS}
    for node in nodes:
        if node["NodeID"] in seen_alive and not node["Alive"]:
            return {"what": "Ray node", "node": names[node["NodeID"]],
                    "cause": node.get("DeathReasonMessage") or "it stopped answering"}
    return None


class ActorWatch:
    def __init__(self, progress_dir: Path | None) -> None:
        self._progress_dir = progress_dir
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="molt-flashreinforce-actor-watch", daemon=True)

    def _run(self) -> None:
        import ray
        import ray._private.state as gcs_state  # the GCS tables; ray.util.state needs the dashboard

        job_id = ray.get_runtime_context().get_job_id()
        seen_alive: dict[str, str] = {}
        while not self._stopped.wait(POLL_S):
            nodes = ray.nodes()
            fault = find_fault(list(gcs_state.actors().values()), nodes, job_id, seen_alive)
            seen_alive.update(node_names([node for node in nodes if node["Alive"]]))
            if fault is None or self._stopped.is_set():
                continue
            fault["step"] = reported_step(self._progress_dir)
            if self._progress_dir is not None:  # a worker's own record of why it stopped comes first
                fault = record_failure(self._progress_dir, fault)
            print(failure_line(fault), file=sys.stderr, flush=True)
            os._exit(EXIT_STATUS)  # not SystemExit: Molt's driver is blocked in ray.get in the main thread

    def start(self) -> "ActorWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def name_the_fault(self, grace_s: float = FAULT_GRACE_S) -> None:
        """Molt raised: give the watch `grace_s` to find a dead actor or node (it then ends the process)."""
        self._thread.join(timeout=grace_s)


def start(progress_dir: str | None) -> ActorWatch:
    return ActorWatch(Path(progress_dir) if progress_dir else None).start()
