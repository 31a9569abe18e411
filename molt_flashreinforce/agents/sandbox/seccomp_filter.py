"""The seccomp filter every sandboxed program runs under, compiled to BPF with libseccomp.

``filter_bpf()`` returns the compiled program (bytes, built once per process) that bubblewrap
loads with ``--seccomp`` just before it executes the program. Everything is allowed except
the kernel interfaces a Python program for a math tool never needs and that widen the attack
surface or open a channel out of the call: the key-management syscalls (keyrings outlive a
process and are shared by its session), io_uring, bpf, perf events, ptrace and cross-process
memory access, every mount and namespace syscall (no new user namespace, no re-entering the
host's), kexec, modules, reboot, swap, accounting, the kernel log, userfaultfd and file
handles. They fail with ``EPERM``, so the program gets a normal ``PermissionError``.
``clone3`` fails with ``ENOSYS``, so the C library falls back to ``clone``, whose flags the
filter can inspect (``clone3`` passes them in memory, out of a filter's reach); ``clone``
with ``CLONE_NEWUSER`` is denied. System calls of a foreign architecture (for example 32-bit
calls from a 64-bit process) kill the process: libseccomp's default for architectures not in
the filter.
"""

from __future__ import annotations

import errno
import functools
import os

import pyseccomp

CLONE_NEWUSER = 0x10000000

DENIED_SYSCALLS = (
    "keyctl", "add_key", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "bpf", "perf_event_open", "userfaultfd",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig",
    "fspick", "mount_setattr", "unshare", "setns",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "reboot", "swapon", "swapoff", "acct", "syslog", "quotactl", "lookup_dcookie",
    "open_by_handle_at", "name_to_handle_at", "iopl", "ioperm", "uselib", "vhangup",
)  # fmt: skip


@functools.lru_cache(maxsize=1)
def filter_bpf() -> bytes:
    """The compiled filter for this machine's architecture."""
    rules = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            rules.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
        except OSError:
            # A syscall this architecture does not have (iopl on arm64) needs no rule.
            continue
    rules.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    rules.add_rule(
        pyseccomp.ERRNO(errno.EPERM), "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
    )
    sink = os.memfd_create("molt-fr-seccomp", os.MFD_CLOEXEC)
    try:
        rules.export_bpf(open(sink, "wb", closefd=False))
        return os.pread(sink, os.fstat(sink).st_size, 0)
    finally:
        os.close(sink)
