"""A Ray cluster over a multi-node SLURM allocation: one Ray node per SLURM node.

    lead(allocation, settings, resources, run_dir, job)   # on the allocation's first node, inside
    with heading(allocation, run_dir): ...                # which wraps all of the head task's work
    join(allocation, settings, resources, run_dir)        # on every other node
    wait_for_nodes(...), request_stacks(...)              # the supervisor's, between attempts

`lead` starts the Ray head, waits until every node of the allocation has joined (at most
`settings.join_timeout_s`; past it, one line names the nodes that did not), calls
`job(env)` with RAY_ADDRESS (and the token settings) in `env`, and stops the head when the job returns, fails or is cancelled.
`join` waits for this job's head to be reachable (same timeout), refuses in one line when its
Python or Ray differs from the head's, starts its Ray node, and stops it as soon as the head
stops; a Ray node that dies while the head is up (a killed raylet) is started again, so that the
supervisor (cluster.supervisor) can restart the run on the whole allocation. A worker leaves
SLURM's signals to the head (it stops when the head does) and writes its processes' stacks when
the head's stall watchdog asks. Every node keeps its `ray start` output and its Ray session logs (which hold the Molt
actors' output on that node) in `<run_dir>/cluster/<job id>/<node>/`, and leaves no process of
the run behind (`processes`). A job's exit status is the head's: the workers exit 0 when the
head stops.

Ray's token authentication is set explicitly and the same way on every node: the head writes a
fresh token for the job (`<run_dir>/cluster/<job id>/auth_token`, mode 0600, on the shared
filesystem the run directory needs anyway) and every `ray start`, the driver and the probes get
RAY_AUTH_MODE=token with RAY_AUTH_TOKEN_PATH pointing at it. Left to itself, Ray 2.59 turns
token mode on at the head when `~/.ray/auth_token` exists, but not at the workers, which then
fail to join with `InvalidAuthToken`.

Each Ray node carries a custom resource `molt_flashreinforce_node:<SLURM node name>` of 1, so
that `actor_map` can say which SLURM node hosted which actor (two Ray nodes on one host, as in
a rehearsal, share an IP address). The head writes `<run_dir>/cluster/<job id>/head.json`
(address, Python and Ray versions, state); the workers read it, and a worker that refuses to
join writes `<node>.error`, which the head reports at once instead of waiting out the timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from molt_flashreinforce.cluster import processes, stacks
from molt_flashreinforce.cluster.errors import ClusterError
from molt_flashreinforce.cluster.slurm import Allocation

NODE_RESOURCE = "molt_flashreinforce_node:"
CLUSTER_SUBDIR = "cluster"
HEAD_RECORD = "head.json"
STACKS_REQUEST = "stacks_request.json"
TOKEN_NAME = "auth_token"
POLL_S = 2.0
# The head counts as gone after this many failed connections in a row (a busy GCS may miss one).
HEAD_LOST_AFTER = 3


@dataclass(frozen=True)
class ClusterSettings:
    """`cluster.*` of the config."""

    ray_port: int = 6379
    join_timeout_s: float = 600.0

    @classmethod
    def from_node(cls, node) -> "ClusterSettings":
        return cls(ray_port=int(node.ray_port), join_timeout_s=float(node.join_timeout_s))


@dataclass(frozen=True)
class NodeResources:
    """What each node's `ray start` declares; None lets Ray detect it (a GPU node's GPUs)."""

    num_cpus: int | None = None
    num_gpus: int | None = None
    extra_args: tuple[str, ...] = ()  # every node's `ray start`
    head_args: tuple[str, ...] = ()  # the head's only (Ray refuses some options on workers)
    worker_args: tuple[str, ...] = ()  # the other nodes' only


def versions() -> dict[str, str]:
    import ray

    return {"python": platform.python_version(), "ray": ray.__version__}


def cluster_dir(run_dir: Path, allocation: Allocation) -> Path:
    return run_dir / CLUSTER_SUBDIR / allocation.run_id


def _ray_start(allocation: Allocation, settings: ClusterSettings, resources: NodeResources) -> list[str]:
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block"]
    if allocation.is_head:
        argv += ["--head", f"--port={settings.ray_port}", "--disable-usage-stats"]
    else:
        argv += [f"--address={allocation.head_address}:{settings.ray_port}"]
    if resources.num_cpus is not None:
        argv.append(f"--num-cpus={resources.num_cpus}")
    if resources.num_gpus is not None:
        argv.append(f"--num-gpus={resources.num_gpus}")
    argv.append("--resources=" + json.dumps({NODE_RESOURCE + allocation.this_node: 1}))
    return [*argv, *resources.extra_args, *(resources.head_args if allocation.is_head else resources.worker_args)]


def _auth_env(where: Path) -> dict[str, str]:
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(where / TOKEN_NAME)}


def _node_env(where: Path) -> dict[str, str]:
    # Ray 2.59 drains a node for up to 30 s on SIGTERM (for Serve replicas); a Molt run that ended
    # or was cancelled has nothing to drain, and 30 s is SLURM's whole KillWait before SIGKILL.
    return {**_auth_env(where), "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}


def _write_token(where: Path) -> None:
    token = where / TOKEN_NAME
    token.parent.mkdir(parents=True, exist_ok=True)
    token.unlink(missing_ok=True)
    descriptor = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secrets.token_hex(32))


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=POLL_S):
            return True
    except OSError:
        return False


_ANSWER_MARK = "molt_flashreinforce_live_nodes="
_PROBE = """
import json, ray
ray.init(address={address!r}, log_to_driver=False, logging_level="ERROR")
names = [key[len({prefix!r}):] for node in ray.nodes() if node["Alive"] for key in node["Resources"]
         if key.startswith({prefix!r})]
print({mark!r} + json.dumps(names), flush=True)
"""


def _live_nodes(address: str, where: Path) -> set[str] | None:
    """The SLURM names of the cluster's live nodes (None: the head did not answer, or not clearly)."""
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE.format(address=address, prefix=NODE_RESOURCE, mark=_ANSWER_MARK)],
                              capture_output=True, text=True, timeout=120, check=False,
                              env={**os.environ, **_auth_env(where)})
    except subprocess.TimeoutExpired:
        return None
    # Ray may print on stdout too (a busy GCS's warnings): only our marked line is the answer.
    answers = [line[len(_ANSWER_MARK):] for line in done.stdout.splitlines() if line.startswith(_ANSWER_MARK)]
    if done.returncode != 0 or not answers:
        return None
    try:
        return set(json.loads(answers[-1]))
    except ValueError:
        return None


def _write_record(record: Path, **fields) -> None:
    record.parent.mkdir(parents=True, exist_ok=True)
    partial = record.with_suffix(".partial")
    partial.write_text(json.dumps(fields, indent=1))
    partial.replace(record)


def _read_record(record: Path, job_id: str) -> dict | None:
    try:
        fields = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    return fields if fields.get("job_id") == job_id else None


def _start(argv: list[str], where: Path, node: str) -> subprocess.Popen:
    log_path = where / node / "ray_start.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **_node_env(where)}, preexec_fn=processes.shielded)


def _stop(node: subprocess.Popen) -> None:
    """`ray start --block` and every Ray process it started on this node."""
    processes.stop_tree(node.pid, grace_s=20)
    node.wait()


def _keep_logs(node_dir: Path) -> None:
    """This node's Ray session logs (Molt's actors print there) into the run directory."""
    session_dir = _session_dir_of(node_dir / "ray_start.log")
    if session_dir and Path(session_dir, "logs").is_dir():
        shutil.copytree(Path(session_dir, "logs"), node_dir / "ray_logs", dirs_exist_ok=True,
                        ignore=lambda folder, names: [n for n in names if Path(folder, n).is_socket()])


def _wait_for_nodes(allocation: Allocation, settings: ClusterSettings, head: subprocess.Popen | None, where: Path) -> None:
    """Block until every node of the allocation is a live Ray node."""
    address = f"{allocation.head_address}:{settings.ray_port}"
    deadline = time.monotonic() + settings.join_timeout_s
    joined: set[str] = set()
    while True:
        if head is not None and head.poll() is not None:
            raise ClusterError(f"the Ray head on {allocation.this_node} exited with status {head.returncode} before "
                               f"the cluster formed; its output is in {where / allocation.this_node / 'ray_start.log'}")
        refusals = sorted(where.glob("*.error"))
        if refusals:
            raise ClusterError(refusals[0].read_text().strip())
        answer = _live_nodes(address, where) if _reachable(allocation.head_address, settings.ray_port) else None
        if answer is not None:
            joined = answer
            if joined >= set(allocation.nodes):
                return
        if time.monotonic() > deadline:
            missing = [node for node in allocation.nodes if node not in joined]
            raise ClusterError(
                f"node(s) {', '.join(missing)} did not join the Ray cluster at {address} within "
                f"{settings.join_timeout_s:g} s (cluster.join_timeout_s); their own output is in {where}/<node>/ "
                "and in the SLURM job output")
        time.sleep(POLL_S)


def wait_for_nodes(allocation: Allocation, settings: ClusterSettings, run_dir: Path) -> None:
    """On the head, between attempts: every node live again (one that lost its Ray node rejoins)."""
    _wait_for_nodes(allocation, settings, None, cluster_dir(run_dir, allocation))


def request_stacks(allocation: Allocation, run_dir: Path, out_dir: Path) -> None:
    """Ask every worker node to write its processes' Python stacks into `out_dir/<node>/`."""
    _write_record(cluster_dir(run_dir, allocation) / STACKS_REQUEST, job_id=allocation.run_id, out_dir=str(out_dir))


@contextlib.contextmanager
def heading(allocation: Allocation | None, run_dir: Path) -> Iterator[None]:
    """Around all of the head task's work (preparing the job, then `lead`): if it fails before the
    cluster is up, the workers waiting for it stop at once instead of at their join timeout."""
    try:
        yield
    except BaseException:
        if allocation is not None and allocation.is_head:
            record = cluster_dir(run_dir, allocation) / HEAD_RECORD
            fields = _read_record(record, allocation.run_id) or {"job_id": allocation.run_id, "node": allocation.this_node}
            _write_record(record, **{**fields, "state": "stopped"})
        raise


def lead(allocation: Allocation, settings: ClusterSettings, resources: NodeResources, run_dir: Path,
         job: Callable[[dict[str, str]], None]) -> None:
    processes.become_subreaper()
    processes.terminate_on_sigterm()
    where = cluster_dir(run_dir, allocation)
    record = where / HEAD_RECORD
    address = f"{allocation.head_address}:{settings.ray_port}"
    fields = {"job_id": allocation.run_id, "address": address, "node": allocation.this_node, **versions()}
    _write_token(where)
    _write_record(record, **fields, state="starting")
    head = _start(_ray_start(allocation, settings, resources), where, allocation.this_node)
    try:
        _wait_for_nodes(allocation, settings, head, where)
        _write_record(record, **fields, state="up")
        print(f"Ray cluster up: {len(allocation.nodes)} nodes ({', '.join(allocation.nodes)}), head {address}", flush=True)
        job({"RAY_ADDRESS": address, **_auth_env(where)})
    finally:
        _write_record(record, **fields, state="stopped")
        _stop(head)
        _keep_logs(where / allocation.this_node)
        processes.stop_descendants()


def _wait_for_head(allocation: Allocation, settings: ClusterSettings, record: Path) -> dict:
    deadline = time.monotonic() + settings.join_timeout_s
    while True:
        head = _read_record(record, allocation.run_id)
        if head is not None and head["state"] == "stopped":
            raise ClusterError(f"the Ray head on {allocation.nodes[0]} stopped before {allocation.this_node} joined")
        if head is not None and _reachable(allocation.head_address, settings.ray_port):
            return head
        if time.monotonic() > deadline:
            what = "started but is out of reach" if head is not None else "did not come up"
            raise ClusterError(
                f"the Ray head of job {allocation.job_id} at {allocation.head_address}:{settings.ray_port} {what} "
                f"from {allocation.this_node} within {settings.join_timeout_s:g} s (cluster.join_timeout_s); check that "
                f"{allocation.this_node} reaches {allocation.nodes[0]}'s NodeAddr on port cluster.ray_port, and the head's output")
        time.sleep(POLL_S)


def _version_problem(allocation: Allocation, head: dict) -> str | None:
    mine = versions()
    if all(head.get(name) == value for name, value in mine.items()):
        return None
    return (f"node {allocation.this_node} runs Python {mine['python']} and Ray {mine['ray']}, but the head "
            f"({head['node']}) runs Python {head.get('python')} and Ray {head.get('ray')}: install the same Python "
            "and Ray on every node (one environment on a shared filesystem does it)")


def join(allocation: Allocation, settings: ClusterSettings, resources: NodeResources, run_dir: Path) -> None:
    processes.become_subreaper()
    processes.defer_signals()  # the head decides what SLURM's signals mean; this node stops when it does
    where = cluster_dir(run_dir, allocation)
    try:
        _serve_as_worker(allocation, settings, resources, where)
    except ClusterError as error:  # the head reports it at once instead of waiting out its timeout
        where.mkdir(parents=True, exist_ok=True)
        (where / f"{allocation.this_node}.error").write_text(f"{error}\n")
        raise


def _head_stopped(record: Path, allocation: Allocation) -> bool:
    head = _read_record(record, allocation.run_id)
    return head is not None and head["state"] == "stopped"


def _serve_as_worker(allocation: Allocation, settings: ClusterSettings, resources: NodeResources, where: Path) -> None:
    record = where / HEAD_RECORD
    head = _wait_for_head(allocation, settings, record)
    problem = _version_problem(allocation, head)
    if problem:
        raise ClusterError(problem)
    lost = 0
    stacks_seen = None
    node = _start(_ray_start(allocation, settings, resources), where, allocation.this_node)
    try:
        while True:
            if node.poll() is not None:
                if _head_stopped(record, allocation):
                    return
                if not _reachable(allocation.head_address, settings.ray_port):
                    raise ClusterError(f"the Ray node on {allocation.this_node} exited with status {node.returncode} "
                                       f"and the head is out of reach; its output is in "
                                       f"{where / allocation.this_node / 'ray_start.log'}")
                # This node's Ray died (its raylet was killed, it ran out of memory) while the run goes
                # on: a fresh node joins, and the head's supervisor restarts Molt once it is back.
                print(f"{allocation.this_node}: the Ray node exited with status {node.returncode}; joining again",
                      flush=True)
                _keep_logs(where / allocation.this_node)
                node = _start(_ray_start(allocation, settings, resources), where, allocation.this_node)
            lost = 0 if _reachable(allocation.head_address, settings.ray_port) else lost + 1
            if _head_stopped(record, allocation) or lost >= HEAD_LOST_AFTER:
                return
            stacks_request = _read_record(where / STACKS_REQUEST, allocation.run_id)
            if stacks_request and stacks_request["out_dir"] != stacks_seen:
                stacks_seen = stacks_request["out_dir"]
                stacks.dump_descendants(Path(stacks_seen) / allocation.this_node)
            time.sleep(POLL_S)
    finally:
        _stop(node)
        _keep_logs(where / allocation.this_node)
        processes.stop_descendants()


def _session_dir_of(ray_start_log: Path) -> str | None:
    """The session directory of this node, from the log paths its `ray start --block` printed."""
    text = ray_start_log.read_text(errors="replace") if ray_start_log.is_file() else ""
    for word in text.split():
        if "/session_" in word:
            head, _, rest = word.partition("/session_")
            return f"{head}/session_{rest.split('/')[0]}"
    return None
