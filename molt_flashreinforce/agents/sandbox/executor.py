"""Run untrusted Python code under a real sandbox and return its bounded output.

Contract: ``run_python(code, limits)`` blocks until the code finished, timed out or flooded
its output, and always returns an ``ExecutionResult`` (model errors are results, never
exceptions); ``await run_python_async(...)`` does the same on a dedicated thread pool, so
Molt's rollout event loop keeps running. Only a sandbox that cannot be set up at all raises
``SandboxSetupError``.

Each call gets a fresh scratch directory (removed afterwards), a scrubbed environment, its
own process group and session, rlimits (``SandboxLimits``) and, as root, namespaces plus a
uid of its own (see ``jail.py``). On timeout or output overflow every process of the call is
killed: the process group, and as root every process running under the call's uid (the
code's PID namespace dies with its first process). Where the kernel refuses namespaces the
call still runs, with a loud one-time warning naming what is missing (``isolation()``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass

from molt_flashreinforce.agents.sandbox.jail import SETUP_ERROR_MARKER, SETUP_FAILED_EXIT

logger = logging.getLogger(__name__)

JAIL_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jail.py")
# Per-call uids come from a range no distribution assigns, so a kill by uid hits only the call.
SANDBOX_UID_BASE = 1_500_000_000
SANDBOX_UID_SPAN = 1 << 24
_SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    # One thread per numeric library: the process limit counts threads.
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_POOL = concurrent.futures.ThreadPoolExecutor(
    max_workers=int(os.environ.get("PYTHON_EXECUTOR_THREADS", "32")), thread_name_prefix="python-sandbox"
)


class SandboxSetupError(RuntimeError):
    """The sandbox itself could not be built (not an error of the code it was given)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource bounds of one call. Environment names follow Molt's Python tool example."""

    timeout_s: float = 10.0
    memory_bytes: int = 1 << 30
    max_processes: int = 64
    max_file_bytes: int = 16 << 20
    max_open_files: int = 64
    output_chars: int = 2048
    max_output_bytes: int = 1 << 20  # past this the call is killed, not just truncated

    @classmethod
    def from_env(cls, environ=None) -> SandboxLimits:
        environ = os.environ if environ is None else environ
        defaults = cls()
        try:
            return cls(
                timeout_s=float(environ.get("PYTHON_EXECUTOR_TIMEOUT", defaults.timeout_s)),
                memory_bytes=int(environ.get("PYTHON_EXECUTOR_MEM_BYTES", defaults.memory_bytes)),
                output_chars=int(environ.get("PYTHON_EXECUTOR_OUTPUT_CHARS", defaults.output_chars)),
            )
        except ValueError as exc:
            raise ValueError(
                f"Bad PYTHON_EXECUTOR_* setting ({exc}): TIMEOUT takes seconds, MEM_BYTES and OUTPUT_CHARS integers."
            ) from exc


@dataclass(frozen=True)
class ExecutionResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when the sandbox killed the call
    timed_out: bool
    output_exceeded: bool
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_exceeded

    def observation(self, output_chars: int) -> str:
        """What the model reads back: the output, truncated, plus a plain error line."""
        parts = []
        if self.stdout:
            parts.append(_truncate(self.stdout, output_chars))
        if self.stderr:
            parts.append("[stderr]\n" + _truncate(self.stderr, output_chars))
        if self.timed_out:
            parts.append(f"Error: execution timed out after {self.elapsed_s:.1f} s and was killed.")
        elif self.output_exceeded:
            parts.append("Error: the program printed too much output and was killed.")
        elif self.exit_code is not None and self.exit_code > 128:
            name = signal.Signals(self.exit_code - 128).name if self.exit_code - 128 in _SIGNALS else "a signal"
            parts.append(f"Error: the program was killed by {name} (a resource limit was hit).")
        elif self.exit_code:
            parts.append(f"Error: the program exited with status {self.exit_code}.")
        return "\n".join(parts) if parts else "(no output)"


_SIGNALS = {s.value for s in signal.Signals}


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [output truncated to {limit} characters]"


@dataclass(frozen=True)
class Isolation:
    """Which protections this machine gives; ``missing`` lists the ones it does not."""

    mode: str  # "namespaces" (root), "user-network" or "none"
    network: bool
    filesystem: bool
    pid_namespace: bool
    own_uid: bool

    @property
    def missing(self) -> list[str]:
        names = ("network", "filesystem", "pid_namespace", "own_uid")
        return [name for name in names if not getattr(self, name)]


def _exposed_paths() -> list[str]:
    """Directories the unprivileged code must reach to start this interpreter."""
    paths = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    return sorted(os.path.realpath(p) for p in paths)


def _launch(code: str, limits: SandboxLimits, mode: str):
    """Write the code into a fresh scratch dir and start the jail; returns (proc, scratch, uid)."""
    scratch = tempfile.mkdtemp(prefix="molt-fr-sandbox-")
    with open(os.path.join(scratch, "main.py"), "w") as f:
        f.write(code)
    uid = None
    if mode == "namespaces":
        uid = SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UID_SPAN)
        os.chown(scratch, uid, uid)
    env = dict(_SANDBOX_ENV, HOME=scratch, TMPDIR=scratch)
    config = {
        "mode": mode,
        "uid": uid,
        "scratch": scratch,
        "exposed_paths": _exposed_paths(),
        "argv": [sys.executable, "-I", "-B", "-u", "main.py"],
        "env": env,
        "limits": {
            "cpu_seconds": int(limits.timeout_s) + 1,
            "memory_bytes": limits.memory_bytes,
            "max_processes": limits.max_processes,
            "max_file_bytes": limits.max_file_bytes,
            "max_open_files": limits.max_open_files,
        },
    }
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-B", JAIL_SCRIPT, json.dumps(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=scratch,
        env=env,
        start_new_session=True,
        close_fds=True,
    )
    return proc, scratch, uid


class _BoundedReader(threading.Thread):
    """Drains one pipe, keeping the first ``keep`` bytes; flags a flood past ``budget``."""

    def __init__(self, pipe, keep: int, budget: "_OutputBudget"):
        super().__init__(daemon=True)
        self.pipe, self.keep, self.budget = pipe, keep, budget
        self.kept = bytearray()

    def run(self):
        while chunk := self.pipe.read1(65536):
            room = self.keep - len(self.kept)
            if room > 0:
                self.kept += chunk[:room]
            self.budget.spend(len(chunk))

    def text(self) -> str:
        return self.kept.decode("utf-8", errors="replace")


class _OutputBudget:
    def __init__(self, limit: int):
        self.limit, self.used = limit, 0
        self.exceeded = threading.Event()
        self._lock = threading.Lock()

    def spend(self, n: int):
        with self._lock:
            self.used += n
            if self.used > self.limit:
                self.exceeded.set()


def _live_processes_of_uid(uid: int) -> list[int]:
    """Pids running under ``uid``, zombies excluded (they are dead, only not yet reaped)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if int(status["Uid"].split()[0]) == uid and not status["State"].strip().startswith("Z"):
            pids.append(int(entry))
    return pids


def _kill_everything(proc: subprocess.Popen, uid: int | None):
    """SIGKILL every process of the call: by uid first (the code may have left its process
    group with setsid, never its uid), so the jail's relay process can reap its child, then
    the process group for whatever has no uid of its own."""
    if uid is not None:
        for _ in range(100):
            pids = _live_processes_of_uid(uid)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)
        else:
            logger.error("Sandbox uid %d still has processes after repeated SIGKILL.", uid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_python(code: str, limits: SandboxLimits | None = None) -> ExecutionResult:
    """Execute ``code`` as ``main.py`` in a fresh sandbox; blocking (see ``run_python_async``)."""
    limits = limits or SandboxLimits.from_env()
    iso = isolation()
    start = time.monotonic()
    proc, scratch, uid = _launch(code, limits, iso.mode)
    try:
        budget = _OutputBudget(limits.max_output_bytes)
        keep = 4 * limits.output_chars + 1024
        readers = [_BoundedReader(proc.stdout, keep, budget), _BoundedReader(proc.stderr, keep, budget)]
        for reader in readers:
            reader.start()
        deadline = start + limits.timeout_s
        timed_out = False
        while proc.poll() is None:
            if budget.exceeded.is_set():
                break
            if time.monotonic() >= deadline:
                timed_out = True
                break
            budget.exceeded.wait(0.005)
        killed = proc.poll() is None
        _kill_everything(proc, uid)
        exit_code = proc.wait()
        for reader in readers:
            # A stray descendant (only possible without a PID namespace) may hold the pipe.
            reader.join(timeout=1.0)
        elapsed = time.monotonic() - start
        stderr = readers[1].text()
        if exit_code == SETUP_FAILED_EXIT and SETUP_ERROR_MARKER in stderr:
            raise SandboxSetupError(stderr.strip())
        return ExecutionResult(
            stdout=readers[0].text(),
            stderr=stderr,
            exit_code=None if killed else exit_code,
            timed_out=timed_out,
            output_exceeded=budget.exceeded.is_set() and not timed_out,
            elapsed_s=elapsed,
        )
    finally:
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
        shutil.rmtree(scratch, ignore_errors=True)


async def run_python_async(code: str, limits: SandboxLimits | None = None) -> ExecutionResult:
    """``run_python`` on the sandbox thread pool, so the calling event loop is never blocked."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, functools.partial(run_python, code, limits))


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
print(json.dumps({
    "interfaces": [name for _, name in socket.if_nameindex()],
    "uid": os.getuid(),
    "pid": os.getpid(),
    "root_writable": can_write("/"),
}))
"""


@functools.lru_cache(maxsize=1)
def isolation() -> Isolation:
    """Probe once which isolation mode works here (by running the real jail), warn if weak."""
    for mode in ("namespaces", "user-network", "none"):
        if mode == "namespaces" and os.geteuid() != 0:
            continue
        proc, scratch, _ = _launch(_PROBE_CODE, SandboxLimits(timeout_s=30.0), mode)
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if proc.returncode != 0:
            logger.info("Sandbox mode %r unavailable: %s", mode, err.decode(errors="replace").strip())
            continue
        seen = json.loads(out)
        result = Isolation(
            mode=mode,
            network=seen["interfaces"] == ["lo"] and mode != "none",
            filesystem=not seen["root_writable"] and mode == "namespaces",
            pid_namespace=seen["pid"] == 1,
            own_uid=mode == "namespaces" and seen["uid"] >= SANDBOX_UID_BASE,
        )
        if result.missing:
            message = (
                f"PYTHON SANDBOX IS WEAKENED on this machine (mode {mode!r}): no {', '.join(result.missing)} "
                "isolation. Model-written code can reach what this process can. Run the rollout workers as root "
                "in a container that allows namespaces (CAP_SYS_ADMIN) for the full sandbox."
            )
            logger.warning(message)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        return result
    raise SandboxSetupError("The Python sandbox cannot start its interpreter on this machine in any mode.")
