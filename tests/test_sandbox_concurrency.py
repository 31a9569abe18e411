"""64 hostile and innocent calls at once: every result is its own, nothing hangs, nothing leaks.

The calls go through ``run_python_async`` (the tool agent's path), 32 in flight on its thread
pool. Each innocent call prints a token of its own and computes with it, so a result that
reached the wrong caller shows. Afterwards no sandboxed process is alive, this process has the
file descriptors it had before, the temporary directory has no scratch dir, and no call's
cgroup is left. Needs the full isolation mode, like the hostile suite.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import uuid

import pytest

from molt_flashreinforce.agents.sandbox import SandboxLimits, executor, isolation, run_python_async, uids

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or isolation().missing, reason="full sandbox isolation needs root, user namespaces and cgroups"
    ),
]

# A timeout with room for 32 calls sharing two loaded cores: innocent calls must finish.
LIMITS = SandboxLimits(timeout_s=10.0, memory_bytes=256 << 20, max_processes=16, output_chars=200)

HOSTILE = {
    "loop": ("while True:\n    pass\n", lambda r: r.timed_out and r.exit_code is None),
    "fork_bomb": ("import os\nwhile True:\n    os.fork()\n", lambda r: not r.ok),
    "memory": (
        "x = []\nwhile True:\n    x.append(bytearray(b'1') * (32 << 20))\n",
        # MemoryError at the address-space limit, the cgroup's OOM kill, or the timeout on a slow machine.
        lambda r: (r.exit_code == 1 and "MemoryError" in r.stderr) or r.exit_code == 128 + 9 or r.timed_out,
    ),
    "flood": ("while True:\n    print('y' * 65536)\n", lambda r: r.output_exceeded and set(r.stdout.strip()) <= {"y", "\n"}),
    "comm": (
        "import time\nopen('/proc/self/comm', 'wb').write(b'\\xff\\xfe')\ntime.sleep(60)\n",
        lambda r: r.timed_out,
    ),
    "escapee": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('left')\n",
        lambda r: r.ok and r.stdout == "left\n",
    ),
    "deep": (
        "import os\nfor _ in range(1100):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')\n",
        lambda r: r.ok and r.stdout == "deep\n",
    ),
    "forged_exit": ("import sys\nprint('molt-flashreinforce sandbox setup failed:')\nsys.exit(125)\n", lambda r: r.exit_code == 125),
}


def _innocent(token: str) -> str:
    return f"import hashlib\nprint({token!r}, hashlib.sha256({token!r}.encode()).hexdigest()[:12])\n"


def _live_sandbox_processes() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid=,uid=,stat="], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines() if uids.is_sandbox_uid(int(line.split()[1])) and "Z" not in line.split()[2]]


def test_64_mixed_calls_get_their_own_results_and_leave_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    machine, _ = executor._machine_and_isolation()
    fds_before = sorted(os.listdir("/proc/self/fd"))
    kinds = list(HOSTILE)
    jobs = []
    for i in range(64):
        if i % 2:
            kind = kinds[(i // 2) % len(kinds)]
            jobs.append((kind, HOSTILE[kind][0]))
        else:
            token = uuid.uuid4().hex
            jobs.append((token, _innocent(token)))

    async def everything():
        return await asyncio.wait_for(asyncio.gather(*(run_python_async(code, LIMITS) for _, code in jobs)), 300)

    results = asyncio.run(everything())  # wait_for turns a hang into a failure

    import hashlib

    for (name, _), result in zip(jobs, results):
        assert result.sandbox_error is None, (name, result)
        if name in HOSTILE:
            assert HOSTILE[name][1](result), (name, result)
        else:
            assert result.ok and result.stdout == f"{name} {hashlib.sha256(name.encode()).hexdigest()[:12]}\n", result
    assert _live_sandbox_processes() == []
    assert sorted(os.listdir("/proc/self/fd")) == fds_before
    assert os.listdir(tmp_path) == []
    for parent in machine.cgroups.parents.values():
        assert [d for d in os.listdir(parent) if d.startswith("call-")] == []
