"""One cgroup per sandbox call: the whole call's memory, processes and CPU, killed as one.

``cgroup_backend()`` finds, once per process, where this process may create cgroups: cgroup v2
when its own cgroup can delegate the memory and pids controllers, else cgroup v1 with separate
memory and pids hierarchies (cpu where mounted), else None (a container without a writable
cgroup filesystem, an unprivileged job on a batch node): the caller then relies on per-process
rlimits and says so. Each call's cgroup lives under ``molt-fr-sandbox-<pid>`` inside this
process's own cgroup, so it also counts against whatever limits the host process has.

``CallCgroup.procs_files`` are the files the call's first process writes its pid into (before
it starts anything, so every descendant is born inside); ``kill()`` SIGKILLs every member
(``cgroup.kill`` on v2, repeated rounds over ``cgroup.procs`` otherwise: the pids limit bounds
how many a fork loop can add between rounds) and ``remove()`` deletes the directories. Only
plain pid lists are read, never process-controlled text.
"""

from __future__ import annotations

import atexit
import errno
import functools
import itertools
import logging
import os
import signal
import time
from dataclasses import dataclass

from molt_flashreinforce.agents.sandbox.limits import SandboxLimits

logger = logging.getLogger(__name__)

CFS_PERIOD_US = 100_000
# bubblewrap's own processes (its monitor and the namespace's init) share the call's pids budget.
LAUNCHER_PROCESSES = 4
_KILL_ROUNDS = 200
_REMOVE_WAIT_S = 2.0


@dataclass(frozen=True)
class CgroupBackend:
    version: int  # 2 or 1
    parents: dict[str, str]  # controller ("unified" on v2) -> this process's sandbox parent dir
    _counter: itertools.count

    def create(self, limits: SandboxLimits) -> CallCgroup:
        name = f"call-{next(self._counter)}"
        dirs = {controller: os.path.join(parent, name) for controller, parent in self.parents.items()}
        made = []
        try:
            for path in dirs.values():
                os.mkdir(path, 0o700)
                made.append(path)
            _apply_limits(self.version, dirs, limits)
        except OSError:
            for path in reversed(made):
                _rmdir_quietly(path)
            raise
        return CallCgroup(self.version, dirs)


@dataclass(frozen=True)
class CallCgroup:
    version: int
    dirs: dict[str, str]

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(path, "cgroup.procs") for path in self.dirs.values()]

    def _members_dir(self) -> str:
        return self.dirs["unified"] if self.version == 2 else self.dirs["pids"]

    def members(self) -> list[int]:
        try:
            with open(os.path.join(self._members_dir(), "cgroup.procs")) as f:
                return [int(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def kill(self) -> bool:
        """SIGKILL every member until none is left; False if some survived every round."""
        if self.version == 2:
            try:
                with open(os.path.join(self.dirs["unified"], "cgroup.kill"), "w") as f:
                    f.write("1")
            except FileNotFoundError:
                pass  # kernels before 5.14: the rounds below do it
        for _ in range(_KILL_ROUNDS):
            pids = self.members()
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.001)
        return not self.members()

    def remove(self) -> bool:
        """Delete the call's directories (killing stragglers first); False if one is left."""
        deadline = time.monotonic() + _REMOVE_WAIT_S
        removed = True
        for path in self.dirs.values():
            while True:
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        logger.error("Sandbox cgroup %s could not be removed: %s", path, exc)
                        removed = False
                        break
                    self.kill()
                    time.sleep(0.005)
        return removed


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _apply_limits(version: int, dirs: dict[str, str], limits: SandboxLimits) -> None:
    pids = str(limits.max_processes + LAUNCHER_PROCESSES)
    quota = str(max(1000, int(limits.cpus * CFS_PERIOD_US)))
    if version == 2:
        unified = dirs["unified"]
        _write(os.path.join(unified, "memory.max"), str(limits.memory_bytes))
        if os.path.exists(os.path.join(unified, "memory.swap.max")):
            _write(os.path.join(unified, "memory.swap.max"), "0")
        _write(os.path.join(unified, "pids.max"), pids)
        if os.path.exists(os.path.join(unified, "cpu.max")):
            _write(os.path.join(unified, "cpu.max"), f"{quota} {CFS_PERIOD_US}")
        return
    _write(os.path.join(dirs["memory"], "memory.limit_in_bytes"), str(limits.memory_bytes))
    memsw = os.path.join(dirs["memory"], "memory.memsw.limit_in_bytes")
    if os.path.exists(memsw):  # no swapping past the limit, where swap accounting is on
        _write(memsw, str(limits.memory_bytes))
    _write(os.path.join(dirs["pids"], "pids.max"), pids)
    if "cpu" in dirs:
        _write(os.path.join(dirs["cpu"], "cpu.cfs_period_us"), str(CFS_PERIOD_US))
        _write(os.path.join(dirs["cpu"], "cpu.cfs_quota_us"), quota)


def _rmdir_quietly(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _cgroup_mounts() -> list[tuple[str, str, str, set[str]]]:
    """(fstype, mount root, mount point, super options) of every cgroup mount of this process."""
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            tail = fields[fields.index("-") + 1 :]
            if tail[0] in ("cgroup", "cgroup2"):
                point = fields[4].encode().decode("unicode_escape")
                mounts.append((tail[0], fields[3], point, set(tail[2].split(","))))
    return mounts


def _own_cgroups() -> dict[str, str]:
    """Controller name ("" for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = path
    return own


def _inside(mount_root: str, point: str, path: str) -> str | None:
    if mount_root != "/" and not (path == mount_root or path.startswith(mount_root + "/")):
        return None
    relative = path[len(mount_root) :] if mount_root != "/" else path
    return os.path.join(point, relative.lstrip("/"))


def _make_parent(base: str) -> str:
    parent = os.path.join(base, f"molt-fr-sandbox-{os.getpid()}")
    os.makedirs(parent, mode=0o700, exist_ok=True)
    atexit.register(_rmdir_quietly, parent)
    return parent


def _v2_parent(mounts, own) -> dict[str, str] | None:
    for fstype, root, point, _ in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        base = _inside(root, point, own[""])
        if base is None or not os.path.isdir(base):
            continue
        with open(os.path.join(base, "cgroup.controllers")) as f:
            available = set(f.read().split())
        if not {"memory", "pids"} <= available:
            continue
        wanted = [c for c in ("memory", "pids", "cpu") if c in available]
        _enable(base, wanted)
        parent = _make_parent(base)
        _enable(parent, wanted)
        return {"unified": parent}
    return None


def _enable(path: str, controllers: list[str]) -> None:
    with open(os.path.join(path, "cgroup.subtree_control")) as f:
        enabled = set(f.read().split())
    missing = [c for c in controllers if c not in enabled]
    if missing:
        _write(os.path.join(path, "cgroup.subtree_control"), " ".join("+" + c for c in missing))


def _v1_parents(mounts, own) -> dict[str, str] | None:
    parents = {}
    for controller in ("memory", "pids", "cpu"):
        for fstype, root, point, options in mounts:
            if fstype == "cgroup" and controller in options and controller in own:
                base = _inside(root, point, own[controller])
                if base is not None and os.path.isdir(base):
                    parents[controller] = _make_parent(base)
                    break
    return parents if {"memory", "pids"} <= parents.keys() else None


@functools.lru_cache(maxsize=1)
def cgroup_backend() -> CgroupBackend | None:
    """Where this process can make per-call cgroups, proven by making one; None if nowhere."""
    try:
        mounts, own = _cgroup_mounts(), _own_cgroups()
    except OSError:
        return None
    for version, finder in ((2, _v2_parent), (1, _v1_parents)):
        try:
            parents = finder(mounts, own)
            if parents is None:
                continue
            backend = CgroupBackend(version, parents, itertools.count())
            probe = backend.create(SandboxLimits())
            probe.remove()
            return backend
        except OSError as exc:
            logger.info("cgroup v%d unusable for the sandbox: %s", version, exc)
    return None
