"""Child-side first step of a sandbox call: enter the call's cgroup, then become the sandbox.

Run by path as ``python -I -S -B launcher.py '<json config>'`` (standard library only; nothing
of this package is importable here). The host starts it in a new session with a scrubbed
environment and only the file descriptors it needs. Before anything else can run it:

* writes its own pid into the call's cgroups (so every later process is born inside);
* marks itself (and so every later process) as the OOM killer's first choice, so a host
  short of memory loses a sandboxed program before the process that runs it;
* joins a fresh, empty session keyring (the host's keys are out of reach, and nothing a call
  stores there is seen by the next call);
* sets the rlimits (CPU time, address space, file size, open files, no core dumps; the
  process count too, unless bubblewrap's user namespace is to hold it), ``no_new_privs`` and a
  parent-death signal;
* as root, when a directory the sandbox needs sits under one that other users cannot enter
  (an interpreter under ``/root``): makes a private mount namespace in which that ancestor
  is covered by an empty directory with only the needed directories bound back, so that
  bubblewrap, run as the call's uid, can find its sources;
* as root, switches to the call's own unprivileged uid and gid;
* executes bubblewrap (or, in the fallback mode, the interpreter) with the given argv.

Success is silent: the status pipe is close-on-exec, so the host reads end-of-file once the
exec happened. A failure writes one line to that pipe and exits with ``SETUP_FAILED_EXIT``:
the host never has to guess from the program's own output whether the sandbox worked.
"""

import ctypes
import json
import os
import resource
import signal
import sys

SETUP_FAILED_EXIT = 125
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
KEYCTL_JOIN_SESSION_KEYRING = 1
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
# keyctl(2) has no C library wrapper; its number per architecture.
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "ppc64le": 271, "s390x": 280, "riscv64": 219}

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret, what):
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _prctl(option, value):
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def _mount(source, target, fstype, flags, data=None):
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _expose(hidden):
    """``hidden`` maps an untraversable ancestor to the directories below it to re-expose."""
    _check(_libc.unshare(ctypes.c_int(CLONE_NEWNS)), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    for ancestor, paths in hidden.items():
        # An O_PATH handle still reaches the directory once the tmpfs covers its ancestor.
        handles = [(path, os.open(path, os.O_PATH)) for path in paths]
        _mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
        for path, fd in handles:
            os.makedirs(path, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            os.close(fd)
        _mount(None, ancestor, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _join_fresh_session_keyring():
    number = _SYS_KEYCTL.get(os.uname().machine)
    if number is None:
        return  # the seccomp filter still denies every keyctl call of the program
    ret = _libc.syscall(ctypes.c_long(number), ctypes.c_int(KEYCTL_JOIN_SESSION_KEYRING), None)
    if ret < 0 and ctypes.get_errno() != 38:  # ENOSYS: a kernel without keyrings
        _check(ret, "keyctl(JOIN_SESSION_KEYRING)")


def _set_limits(limits):
    for name, value in (
        ("RLIMIT_CPU", limits["cpu_seconds"]),
        ("RLIMIT_AS", limits["memory_bytes"]),
        ("RLIMIT_NPROC", limits["max_processes"]),
        ("RLIMIT_FSIZE", limits["max_file_bytes"]),
        ("RLIMIT_NOFILE", limits["max_open_files"]),
        ("RLIMIT_CORE", 0),
    ):
        if value is not None:  # None: set later, inside the jail (the process count)
            resource.setrlimit(getattr(resource, name), (value, value))


def _become(uid):
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def main():
    config = json.loads(sys.argv[1])
    status = config["status_fd"]
    os.set_inheritable(status, False)
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        pid = str(os.getpid())
        for procs in config["cgroup_procs"]:
            with open(procs, "w") as f:
                f.write(pid)
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
        _join_fresh_session_keyring()
        if config["hidden"]:
            _expose(config["hidden"])
        _set_limits(config["limits"])
        if config["uid"] is not None:
            _become(config["uid"])
            # A uid change clears the parent-death signal: set it again.
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        if config["cwd"]:
            os.chdir(config["cwd"])
        os.execve(config["argv"][0], config["argv"], config["env"])
    except BaseException as exc:  # noqa: BLE001 - anything here is a setup failure
        os.write(status, f"{type(exc).__name__}: {exc}".encode(errors="replace")[:4000])
        os._exit(SETUP_FAILED_EXIT)


if __name__ == "__main__":
    main()
