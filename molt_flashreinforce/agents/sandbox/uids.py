"""Per-call uids that no two live calls share.

A uid is ``UID_BASE + pid * SLOTS + slot``: the pid keeps concurrent host processes (Ray
workers on one node) apart, and a slot is held by one call of this process from launch to
cleanup, so two overlapping calls never draw the same uid (a random draw could). The range
starts above every uid a distribution assigns and ends below 2**31.
"""

from __future__ import annotations

import contextlib
import os
import threading

# Below 2**31: bubblewrap writes uid maps as signed ints.
UID_BASE = 1 << 30
SLOTS = 256
PID_LIMIT = 1 << 22  # the kernel's ceiling for pid_max on 64-bit machines

_lock = threading.Lock()
_free = list(range(SLOTS))


class NoFreeUid(RuntimeError):
    """More calls in flight in this process than there are slots."""


@contextlib.contextmanager
def call_uid():
    with _lock:
        if not _free:
            raise NoFreeUid(f"more than {SLOTS} sandbox calls are in flight in this process")
        slot = _free.pop()
    try:
        yield UID_BASE + (os.getpid() % PID_LIMIT) * SLOTS + slot
    finally:
        with _lock:
            _free.append(slot)


def is_sandbox_uid(uid: int) -> bool:
    return UID_BASE <= uid < UID_BASE + PID_LIMIT * SLOTS
