"""Child-side bootstrap of the Python sandbox: isolate, limit, drop privileges, exec the code.

Run by path as ``python -I -S -B jail.py '<json config>'`` (standard library only, nothing
from this package is importable here). The host side (``executor.py``) starts it in a new
session with a scrubbed environment; this script then:

* as root: unshares mount, network, PID, IPC and UTS namespaces and forks, so the code runs
  as PID 1 of its own namespace (when it exits, the kernel kills every process it left
  behind); the network namespace has only a downed loopback device; every mount is
  remounted read-only except the scratch directory and a small private ``/dev/shm``; a
  fresh ``/proc`` shows only the sandbox; then it switches to the unprivileged ``uid`` the
  host picked for this call (so no capabilities, hard rlimits stay put, and no host process
  can be signalled);
* not root: tries a user + network namespace for the network alone and otherwise runs with
  process-group containment only (the host warns loudly about what is missing);
* always: sets rlimits (CPU time, address space, processes, file size, open files, no
  core dumps), ``PR_SET_NO_NEW_PRIVS`` and a parent-death signal, and ``execve``s the
  interpreter on the code file with the environment it was given.

A failure while setting up exits with ``SETUP_FAILED_EXIT`` and a ``SETUP_ERROR_MARKER`` line
on stderr, so the host can tell a broken sandbox from code that failed.
"""

import ctypes
import json
import os
import resource
import signal
import stat
import sys

SETUP_FAILED_EXIT = 125
SETUP_ERROR_MARKER = "molt-flashreinforce sandbox setup failed:"

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
# Per-mount flags a bind remount must repeat, or the kernel clears them.
_KEPT_MOUNT_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare(flags):
    _check(_libc.unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def _mount(source, target, fstype, flags, data=None):
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    ret = _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(ret, f"mount {target}")


def _prctl(option, value):
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def _mount_table():
    """(mount point, kept flags) for every mount, parents before children."""
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            # mountinfo escapes blanks and backslashes as octal (\040).
            point = fields[4].encode().decode("unicode_escape")
            flags = 0
            for option in fields[5].split(","):
                flags |= _KEPT_MOUNT_FLAGS.get(option, 0)
            mounts.append((point, flags))
    return sorted(mounts, key=lambda m: m[0].count("/") if m[0] != "/" else 0)


def _hidden_ancestor(path):
    """The outermost directory above ``path`` that other users cannot traverse, or None."""
    parts = os.path.abspath(path).split("/")[1:-1]
    current = ""
    for part in parts:
        current += "/" + part
        if not os.stat(current).st_mode & stat.S_IXOTH:
            return current
    return None


def _isolate_filesystem(scratch, exposed_paths, shm_bytes):
    """Make everything read-only except ``scratch`` and a private /dev/shm; keep the
    interpreter reachable for an unprivileged uid even when it lives under a 0700 home."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount(scratch, scratch, None, MS_BIND | MS_REC)
    hidden = {}
    for path in exposed_paths:
        ancestor = _hidden_ancestor(path)
        if ancestor is not None:
            # An O_PATH handle survives the ancestor being covered by a tmpfs below.
            hidden.setdefault(ancestor, []).append((path, os.open(path, os.O_PATH)))
    for point, flags in _mount_table():
        if point == scratch:
            continue
        try:
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except OSError:
            if point == "/":
                raise
    for ancestor, entries in hidden.items():
        # Cover the private directory with an empty one and bind back only what is needed.
        _mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
        for path, fd in entries:
            os.makedirs(path, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
            os.close(fd)
        _mount(None, ancestor, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, f"mode=1777,size={shm_bytes}")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _set_limits(limits):
    for name, value in (
        ("RLIMIT_CPU", limits["cpu_seconds"]),
        ("RLIMIT_AS", limits["memory_bytes"]),
        ("RLIMIT_NPROC", limits["max_processes"]),
        ("RLIMIT_FSIZE", limits["max_file_bytes"]),
        ("RLIMIT_NOFILE", limits["max_open_files"]),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))


def _drop_privileges(uid):
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _unprivileged_network_namespace():
    """Map ourselves to root in a new user namespace that owns a new network namespace."""
    uid, gid = os.getuid(), os.getgid()
    try:
        _unshare(CLONE_NEWUSER | CLONE_NEWNET)
    except OSError:
        return False
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")
    return True


def _exec_code(config):
    _set_limits(config["limits"])
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    os.chdir(config["scratch"])
    os.execve(config["argv"][0], config["argv"], config["env"])


def _run_as_namespace_init(config):
    """Fork into the new PID namespace; the parent relays the child's exit status."""
    child = os.fork()
    if child:
        _, status = os.waitpid(child, 0)
        if os.WIFSIGNALED(status):
            os._exit(128 + os.WTERMSIG(status))
        os._exit(os.WEXITSTATUS(status))
    try:
        _isolate_filesystem(config["scratch"], config["exposed_paths"], config["limits"]["max_file_bytes"])
        _drop_privileges(config["uid"])
        # Set after the uid change (which clears it): die with the relay process.
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _exec_code(config)
    except BaseException as exc:  # noqa: BLE001 - anything here is a setup failure
        sys.stderr.write(f"{SETUP_ERROR_MARKER} {exc!r}\n")
        sys.stderr.flush()
        os._exit(SETUP_FAILED_EXIT)


def main():
    config = json.loads(sys.argv[1])
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if config["mode"] == "namespaces":
            _unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS)
        elif config["mode"] == "user-network":
            if not _unprivileged_network_namespace():
                raise OSError("user namespaces are not allowed here")
    except BaseException as exc:  # noqa: BLE001
        sys.stderr.write(f"{SETUP_ERROR_MARKER} {exc!r}\n")
        sys.exit(SETUP_FAILED_EXIT)
    if config["mode"] == "namespaces":
        _run_as_namespace_init(config)
    try:
        _exec_code(config)
    except BaseException as exc:  # noqa: BLE001
        sys.stderr.write(f"{SETUP_ERROR_MARKER} {exc!r}\n")
        sys.exit(SETUP_FAILED_EXIT)


if __name__ == "__main__":
    main()
