"""Hostile code against the Python sandbox: each attack is contained, the host is unaffected,
and the model gets a plain error text.

Everything runs for real (no mocks). The suite needs the full isolation mode (root, with user
namespaces and a writable cgroup filesystem, as in the project's container and CI); where the
machine refuses it the suite is skipped with the reason, since there the executor itself warns
that it is weakened. Network checks only ever target loopback.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
import uuid

import pytest

from molt_flashreinforce.agents.sandbox import SandboxLimits, isolation, run_python, run_python_async
from molt_flashreinforce.agents.sandbox.uids import is_sandbox_uid

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or isolation().missing, reason="full sandbox isolation needs root, user namespaces and cgroups"
)

FAST = SandboxLimits(timeout_s=3.0)


def _sandbox_processes() -> list[int]:
    """Live processes under any sandbox uid, anywhere on the host (status read as bytes: a
    sandboxed program may have renamed itself to anything)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                status = dict(line.split(b":", 1) for line in f if b":" in line)
        except OSError:
            continue
        uid = int(status[b"Uid"].split()[0])
        if is_sandbox_uid(uid) and not status[b"State"].strip().startswith(b"Z"):
            found.append(int(entry))
    return found


def _processes_with_marker(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.fixture(autouse=True)
def _host_is_clean_after():
    yield
    assert _sandbox_processes() == [], "a sandboxed process outlived its call"


def test_well_behaved_code_runs_and_prints():
    result = run_python("print(sum(range(101)))", FAST)
    assert result.ok and result.stdout == "5050\n"
    assert result.observation(100) == "5050\n"


def test_infinite_loop_is_killed_at_the_timeout():
    result = run_python("while True:\n    pass\n", SandboxLimits(timeout_s=1.5))
    assert result.timed_out and result.exit_code is None
    assert 1.5 <= result.elapsed_s < 4.0
    assert "timed out after" in result.observation(200)


def test_fork_bomb_hits_the_process_limit_and_host_can_still_fork():
    result = run_python("import os\nwhile True:\n    os.fork()\n", SandboxLimits(timeout_s=2.0, max_processes=16))
    assert not result.ok
    assert "Resource temporarily unavailable" in result.stderr
    assert subprocess.run(["true"]).returncode == 0


def test_memory_bomb_gets_memory_error():
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 2**20))\n"
    result = run_python(code, SandboxLimits(timeout_s=5.0, memory_bytes=512 << 20))
    assert not result.timed_out and result.exit_code == 1
    assert "MemoryError" in result.stderr
    assert "exited with status 1" in result.observation(500)


def test_gigantic_output_is_cut_and_the_call_killed():
    limits = SandboxLimits(timeout_s=10.0, output_chars=100, max_output_bytes=1 << 20)
    result = run_python("while True:\n    print('x' * 100000)\n", limits)
    assert result.output_exceeded and not result.timed_out
    assert result.elapsed_s < 5.0
    text = result.observation(100)
    assert text.startswith("x" * 100 + "\n... [output truncated to 100 characters]")
    assert "printed too much output" in text
    assert len(text) < 300


def test_writes_outside_scratch_fail_and_leave_nothing(tmp_path):
    name = uuid.uuid4().hex
    # /tmp and /var/tmp are world-writable on the host: they do not exist in the sandbox's root,
    # and the root itself and /usr are read-only.
    targets = [f"/tmp/{name}", f"/var/tmp/{name}", str(tmp_path / name), f"../{name}", f"/usr/{name}"]
    code = "import os\n" + "".join(
        f"try:\n    open({t!r}, 'w').write('x')\n    print('WROTE', {t!r})\n"
        f"except OSError as e:\n    print('blocked', e.strerror)\n"
        for t in targets
    ) + "open('inside.txt', 'w').write('fine')\nprint(open('inside.txt').read())\n"
    result = run_python(code, FAST)
    assert result.ok, result.stderr
    assert "WROTE" not in result.stdout
    assert result.stdout.count("blocked") == len(targets)
    assert result.stdout.startswith("blocked No such file or directory\n" * 3 + "blocked Read-only file system\n" * 2)
    assert result.stdout.endswith("fine\n")
    for t in targets[:3]:
        assert not os.path.exists(t)


def test_inherited_secret_env_var_is_not_visible(monkeypatch):
    monkeypatch.setenv("MOLT_FR_TEST_SECRET", "hunter2-secret")
    code = (
        "import os\n"
        "print(sorted(os.environ))\n"
        "print(os.environ.get('MOLT_FR_TEST_SECRET'))\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n"
        "        try:\n            print(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "        except OSError as e:\n            print(pid, e.strerror)\n"
    )
    result = run_python(code, FAST)
    assert result.ok, result.stderr
    assert "hunter2" not in result.stdout + result.stderr
    assert "MOLT_FR_TEST_SECRET" not in result.stdout
    assert "\nNone\n" in result.stdout


def test_sockets_cannot_reach_a_loopback_listener_on_the_host():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.setblocking(False)
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('CONNECTED')\n"
            "except OSError as e:\n"
            "    print('refused:', e)\n"
        )
        result = run_python(code, FAST)
        with pytest.raises(BlockingIOError):
            server.accept()
    assert result.ok, result.stderr
    assert "CONNECTED" not in result.stdout and "refused:" in result.stdout


def test_background_grandchild_does_not_outlive_the_call():
    marker = f"molt-fr-escapee-{uuid.uuid4().hex}"
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv('/bin/sh', ['/bin/sh', '-c', 'sleep 30; : {marker}'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\n"
        "print('parent done')\n"
    )
    start = time.monotonic()
    result = run_python(code, FAST)
    assert result.ok and result.stdout == "parent done\n"
    assert time.monotonic() - start < 3.0
    assert _processes_with_marker(marker) == []


def test_killing_the_parent_and_everyone_else_is_contained():
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        code = (
            "import os, signal\n"
            f"for pid in ({os.getpid()}, {bystander.pid}, os.getppid(), -1):\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n"
            "        print('sent', pid)\n"
            "    except OSError as e:\n"
            "        print('denied', pid, e.strerror)\n"
        )
        result = run_python(code, FAST)
        assert bystander.poll() is None, "a host process was killed from inside the sandbox"
    finally:
        bystander.kill()
        bystander.wait()
    # Host pids do not exist in the sandbox's PID namespace; the parent is bubblewrap's init
    # (pid 1), which ignores a SIGKILL sent from inside, and kill(-1) finds no process to signal.
    assert result.ok, result
    lines = result.stdout.splitlines()
    assert lines[0] == f"denied {os.getpid()} No such process"
    assert lines[1] == f"denied {bystander.pid} No such process"
    assert lines[2:] == ["sent 1", "denied -1 No such process"]


def test_async_calls_do_not_block_the_event_loop():
    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        results = await asyncio.gather(*(run_python_async("import time; time.sleep(0.5); print('ok')", FAST) for _ in range(3)))
        task.cancel()
        return results, ticks

    results, ticks = asyncio.run(main())
    assert [r.stdout for r in results] == ["ok\n"] * 3
    assert ticks >= 20  # the loop kept turning for the ~0.5 s the three calls took together
