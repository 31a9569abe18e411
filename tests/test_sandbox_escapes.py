"""The classes of escape, crash and hang found against the first sandbox, each run for real.

One test (or a few) per class: a hostile name in /proc, the session keyring, a deep directory
tree, memory across forks, disk, host socket files, setup-marker forgery and unencodable code,
overlapping calls' uids, readable host files, and the seccomp filter. Like the hostile suite it
needs the full isolation mode and is skipped, with the reason, where the machine refuses it.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from molt_flashreinforce.agents.sandbox import SandboxLimits, executor, isolation, run_python, uids

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or isolation().missing, reason="full sandbox isolation needs root, user namespaces and cgroups"
)

FAST = SandboxLimits(timeout_s=5.0)
REPO = Path(__file__).resolve().parents[1]


def test_a_non_utf8_process_name_neither_crashes_nor_hangs_the_host():
    code = (
        "import time\n"
        "open('/proc/self/comm', 'wb').write(b'\\xff\\xfe\\x80bad')\n"
        "print('renamed', flush=True)\n"
        "time.sleep(60)\n"
    )
    other = {}
    neighbour = threading.Thread(target=lambda: other.update(result=run_python("print('neighbour')", FAST)))
    start = time.monotonic()
    neighbour.start()
    result = run_python(code, SandboxLimits(timeout_s=1.5))
    neighbour.join(timeout=30)
    assert result.timed_out and result.stdout == "renamed\n"
    assert time.monotonic() - start < 10
    assert other["result"].stdout == "neighbour\n"


def _add_host_key(description: str, payload: bytes) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    key = libc.syscall(248, b"user", description.encode(), payload, len(payload), -3)  # add_key, @s
    if key < 0:
        pytest.skip(f"this kernel has no usable keyring (errno {ctypes.get_errno()})")
    return key


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the host-side key uses x86_64 syscall numbers")
def test_keyrings_are_fresh_per_call_and_out_of_reach():
    description = f"molt-fr-host-secret-{uuid.uuid4().hex}"
    _add_host_key(description, b"hunter2")
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for name, args in (('keyctl', (250, 0, -3, 0)), ('add_key', (248, b'user', b'note', b'x', 1, -3)),\n"
        "                   ('request_key', (249, b'user', b'note', None, 0))):\n"
        "    ret = libc.syscall(*args)\n"
        "    print(name, ret, os.strerror(ctypes.get_errno()) if ret < 0 else 'ALLOWED')\n"
        "try:\n"
        "    print(open('/proc/keys').read() or 'no keys')\n"
        "except OSError as e:\n"
        "    print('no /proc/keys', e.strerror)\n"
    )
    first, second = run_python(code, FAST), run_python(code, FAST)
    for result in (first, second):
        assert result.ok, result
        lines = result.stdout.splitlines()
        assert lines[:3] == ["keyctl -1 Operation not permitted", "add_key -1 Operation not permitted",
                             "request_key -1 Operation not permitted"]  # fmt: skip
        assert description not in result.stdout and "hunter2" not in result.stdout


def test_a_deep_directory_tree_is_cleaned_up(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = (
        "import os\n"
        "for _ in range(1100):\n"
        "    os.mkdir('d')\n"
        "    os.chdir('d')\n"
        "print('deep', len(os.getcwd()))\n"
    )
    result = run_python(code, FAST)
    assert result.ok and result.stdout.startswith("deep "), result
    assert os.listdir(tmp_path) == []  # scratch was never on the host disk


def test_the_fallback_scratch_removal_handles_deep_trees(tmp_path):
    top = tmp_path / "scratch"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for _ in range(1100):  # built through directory fds: the path is too long for the host
        os.mkdir("d", dir_fd=fd)
        fd, parent = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(parent)
    os.close(fd)
    executor._remove_tree(str(top))
    assert not top.exists()


@pytest.mark.slow
def test_memory_is_capped_for_the_whole_call_not_per_process():
    code = (
        "import os, time\n"
        "children = []\n"
        "for _ in range(8):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        block = bytearray(b'\\x01') * (200 << 20)\n"
        "        time.sleep(1.5)\n"
        "        os._exit(0)\n"
        "    children.append(pid)\n"
        "held = [os.waitpid(pid, 0)[1] for pid in children]\n"
        "print('survivors', sum(status == 0 for status in held))\n"
    )
    result = run_python(code, SandboxLimits(timeout_s=20.0, memory_bytes=256 << 20))
    assert not result.timed_out, result
    if result.exit_code == 0:
        survivors = int(result.stdout.split()[-1])
        assert survivors <= 1  # 8 x 200 MiB never fit in 256 MiB at once
    else:
        assert result.exit_code == 128 + 9  # the OOM killer took the parent instead


def test_sandboxed_programs_are_the_oom_killers_first_choice():
    code = (
        "import os\n"
        "print(open('/proc/self/oom_score_adj').read().strip())\n"
        "fd = os.open('/proc/self/oom_score_adj', os.O_WRONLY)\n"
        "try:\n"
        "    os.write(fd, b'-1')\n"
        "    print('LOWERED')\n"
        "except OSError as e:\n"
        "    print(e.strerror)\n"
    )
    result = run_python(code, FAST)
    assert result.stdout == "1000\nPermission denied\n"  # and it cannot rank itself below the host


def test_disk_is_capped_by_the_scratch_size():
    code = (
        "import errno\n"
        "written = 0\n"
        "try:\n"
        "    for i in range(64):\n"
        "        with open(f'f{i}', 'wb') as f:\n"
        "            f.write(b'x' * (8 << 20))\n"
        "        written += 8 << 20\n"
        "except OSError as e:\n"
        "    print(errno.errorcode[e.errno])\n"
        "print(written >> 20)\n"
    )
    result = run_python(code, SandboxLimits(timeout_s=20.0, scratch_bytes=32 << 20))
    assert result.ok, result
    error, mib = result.stdout.split()
    assert error == "ENOSPC" and int(mib) <= 32


def test_host_unix_sockets_are_unreachable(tmp_path):
    path = tmp_path / "host.sock"
    abstract = f"\0molt-fr-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX) as on_disk, socket.socket(socket.AF_UNIX) as in_abstract:
        on_disk.bind(str(path))
        on_disk.listen(1)
        os.chmod(path, 0o777)
        os.chmod(tmp_path, 0o755)
        in_abstract.bind(abstract)
        in_abstract.listen(1)
        code = (
            "import socket\n"
            f"for address in ({str(path)!r}, {abstract!r}, '/run/docker.sock', '/tmp/.X11-unix/X0'):\n"
            "    try:\n"
            "        socket.socket(socket.AF_UNIX).connect(address)\n"
            "        print('CONNECTED')\n"
            "    except OSError as e:\n"
            "        print(e.strerror)\n"
        )
        result = run_python(code, FAST)
    assert result.ok, result
    assert "CONNECTED" not in result.stdout
    assert result.stdout.splitlines()[0] == "No such file or directory"
    assert result.stdout.splitlines()[1] == "Connection refused"


def test_forging_the_setup_marker_is_just_a_program_exit():
    code = "import sys\nsys.stderr.write('molt-flashreinforce sandbox setup failed: forged\\n')\nsys.exit(125)\n"
    result = run_python(code, FAST)
    assert result.sandbox_error is None and result.exit_code == 125
    assert "exited with status 125" in result.observation(200)


def test_a_lone_surrogate_in_the_code_returns_a_result_and_leaks_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = run_python('s = "\ud800"\nprint(len(s), repr(s))\nx = \ud800\n', FAST)
    assert result.sandbox_error is None and result.exit_code == 1
    assert "SyntaxError" in result.stderr
    ok = run_python('print(len("\ud800"))', FAST)
    assert ok.stdout == "1\n"  # inside a string literal the escaped surrogate means the same
    assert os.listdir(tmp_path) == []


def test_a_real_setup_failure_is_reported_not_raised(monkeypatch):
    machine, found = executor._machine_and_isolation()
    broken = executor._Machine(**{**machine.__dict__, "cgroups": _UnwritableCgroups(machine.cgroups)})
    monkeypatch.setattr(executor, "_machine_and_isolation", lambda: (broken, found))
    result = run_python("print(1)", FAST)
    assert result.sandbox_error is not None and result.sandbox_error.startswith("setup: ")
    assert result.stdout == "" and not result.ok
    assert result.observation(100).startswith("Error: the sandbox failed to run this program")


class _UnwritableCgroups:
    """A cgroup backend whose procs file cannot be written, as when the cgroup vanished."""

    def __init__(self, real):
        self.real = real

    def create(self, limits):
        cgroup = self.real.create(limits)
        return _NoProcs(cgroup)


class _NoProcs:
    def __init__(self, cgroup):
        self.cgroup = cgroup
        self.procs_files = ["/proc/self/nonexistent-cgroup.procs"]

    def kill(self):
        return self.cgroup.kill()

    def remove(self):
        return self.cgroup.remove()


def test_overlapping_calls_never_share_a_uid():
    seen = []
    with uids.call_uid() as first, uids.call_uid() as second:
        seen += [first, second]
    assert first != second and all(uids.is_sandbox_uid(u) for u in seen)
    import asyncio

    from molt_flashreinforce.agents.sandbox import run_python_async

    async def together():
        code = "import os, time\nprint(os.getuid())\ntime.sleep(0.5)\n"
        return await asyncio.gather(*(run_python_async(code, FAST) for _ in range(12)))

    results = asyncio.run(together())
    inside = [int(r.stdout) for r in results]
    assert len(set(inside)) == 12 and all(uids.is_sandbox_uid(u) for u in inside)


def test_uid_slots_run_out_loudly_not_silently(monkeypatch):
    monkeypatch.setattr(uids, "_free", [7])
    with uids.call_uid():
        with pytest.raises(uids.NoFreeUid, match="more than 256 sandbox calls"):
            with uids.call_uid():
                pass
    assert uids._free == [7]


def test_host_files_are_not_in_the_sandbox():
    secrets = [str(REPO / "README.md"), str(Path(__file__).resolve()), "/etc/passwd", "/etc/shadow",
               "/root/.bashrc", "/home", "/tmp", "/var", "/run", "/tmp/ray"]  # fmt: skip
    secrets += [str(p) for p in (REPO / "tests" / "fixtures").rglob("*.jsonl")][:3]
    code = (
        "import os\n"
        f"for path in {secrets!r}:\n"
        "    print(os.path.exists(path))\n"
        "print(sorted(os.listdir('/')))\n"
        "import numpy, sympy\n"
        "print(sympy.Integer(2) ** 10, int(numpy.arange(5).sum()))\n"
    )
    result = run_python(code, SandboxLimits(timeout_s=30.0))
    assert result.ok, result
    lines = result.stdout.splitlines()
    assert lines[: len(secrets)] == ["False"] * len(secrets)
    assert "tmp" not in lines[len(secrets)] and "home" not in lines[len(secrets)]
    assert lines[-1] == "1024 10"  # the tool packages are there


def test_the_seccomp_filter_denies_what_a_math_program_never_needs():
    code = (
        "import ctypes, os, errno\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def call(name, *args):\n"
        "    ret = libc.syscall(*args)\n"
        "    print(name, errno.errorcode.get(ctypes.get_errno(), '?') if ret < 0 else 'ALLOWED')\n"
        "call('ptrace', 101, 0, 1, 0, 0)\n"  # PTRACE_ATTACH to init
        "call('unshare', 272, 0x10000000)\n"  # CLONE_NEWUSER
        "call('mount', 165, b'none', b'/scratch', b'tmpfs', 0, None)\n"
        "call('bpf', 321, 0, None, 0)\n"
        "call('io_uring_setup', 425, 1, None)\n"
        "call('perf_event_open', 298, None, 0, -1, -1, 0)\n"
        "call('clone3', 435, None, 0)\n"
        "call('clone_newuser', 56, 0x10000000 | 17, None, None, None, None)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(7)\n"
        "print('fork', os.waitpid(pid, 0)[1] >> 8)\n"
    )
    if os.uname().machine != "x86_64":
        pytest.skip("the probe uses x86_64 syscall numbers")
    result = run_python(code, FAST)
    assert result.ok, result
    assert result.stdout.splitlines() == [
        "ptrace EPERM", "unshare EPERM", "mount EPERM", "bpf EPERM", "io_uring_setup EPERM",
        "perf_event_open EPERM", "clone3 ENOSYS", "clone_newuser EPERM", "fork 7",
    ]  # fmt: skip


def test_no_host_process_or_cgroup_outlives_the_calls():
    machine, _ = executor._machine_and_isolation()
    run_python("import os\nif os.fork() == 0:\n    os.setsid()\n    import time; time.sleep(30)\n", FAST)
    for parent in machine.cgroups.parents.values():
        assert [d for d in os.listdir(parent) if d.startswith("call-")] == []
    ps = subprocess.run(["ps", "-eo", "uid=,stat="], capture_output=True, text=True, check=True).stdout.splitlines()
    # Zombies are dead: bubblewrap's monitor exits before its namespace's init is reaped, so
    # the host's init reaps that one, in its own time.
    live = [line for line in ps if uids.is_sandbox_uid(int(line.split()[0])) and "Z" not in line.split()[1]]
    assert live == []
