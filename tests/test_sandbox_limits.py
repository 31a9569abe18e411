"""The sandbox's settings, its model-facing texts, and its weaker fallback modes.

All calls run real processes. The fallback tests take one layer away the way a weaker machine
would (no cgroup filesystem; no bubblewrap; an interpreter that cannot start) by replacing the
function that finds it, then clear the one-time probe so the rest of the suite sees this
machine again.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import warnings

import pytest

from molt_flashreinforce.agents.sandbox import (
    ExecutionResult,
    SandboxLimits,
    SandboxSetupError,
    cgroups,
    executor,
    isolation,
    run_python,
    uids,
)


def test_limits_follow_molts_environment_names():
    limits = SandboxLimits.from_env(
        {"PYTHON_EXECUTOR_TIMEOUT": "2.5", "PYTHON_EXECUTOR_MEM_BYTES": "536870912", "PYTHON_EXECUTOR_OUTPUT_CHARS": "100"}
    )
    assert (limits.timeout_s, limits.memory_bytes, limits.output_chars) == (2.5, 1 << 29, 100)
    assert SandboxLimits.from_env({}) == SandboxLimits()
    with pytest.raises(ValueError, match="Bad PYTHON_EXECUTOR_\\* setting"):
        SandboxLimits.from_env({"PYTHON_EXECUTOR_TIMEOUT": "ten"})


@pytest.mark.parametrize("value", ["0", "257", "many"])
def test_bad_thread_count_is_refused_with_the_range(monkeypatch, value):
    monkeypatch.setenv("PYTHON_EXECUTOR_THREADS", value)
    with pytest.raises(ValueError, match=f"PYTHON_EXECUTOR_THREADS must be an integer from 1 to 256, got '{value}'"):
        executor._pool_size()


def make(**kw) -> ExecutionResult:
    base = dict(stdout="", stderr="", exit_code=0, timed_out=False, output_exceeded=False, elapsed_s=0.5)
    return ExecutionResult(**{**base, **kw})


def test_observation_texts():
    assert make().observation(10) == "(no output)"
    assert make(stdout="12345678901234").observation(10) == "1234567890\n... [output truncated to 10 characters]"
    assert make(stderr="Traceback", exit_code=1).observation(50) == "[stderr]\nTraceback\nError: the program exited with status 1."
    assert make(exit_code=128 + 24).observation(50) == "Error: the program was killed by SIGXCPU (a resource limit was hit)."
    assert make(exit_code=None, timed_out=True, elapsed_s=10.04).observation(50) == (
        "Error: execution timed out after 10.0 s and was killed."
    )
    failed = make(exit_code=None, stdout="partial", sandbox_error="setup: PermissionError: cgroup.procs")
    assert not failed.ok
    assert failed.observation(50) == (
        "Error: the sandbox failed to run this program (an internal error, not your code); try again."
    )


@pytest.fixture()
def fresh_probe():
    executor._probe.cache_clear()
    yield
    executor._probe.cache_clear()


def _weakened_warnings(action):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        action()
    return [str(w.message) for w in caught if "PYTHON SANDBOX IS WEAKENED" in str(w.message)]


@pytest.mark.skipif(os.geteuid() != 0, reason="the cgroup layer needs root")
def test_without_cgroups_the_rlimits_hold_and_it_warns_once(monkeypatch, fresh_probe):
    monkeypatch.setattr(cgroups, "cgroup_backend", lambda: None)
    first = _weakened_warnings(isolation)
    if isolation().mode != "bwrap":
        pytest.skip("needs bubblewrap, to isolate the missing cgroup layer")
    assert isolation().missing == ["cgroup"]
    assert len(first) == 1 and "memory and process limits hold per process only (rlimits)" in first[0]
    again = _weakened_warnings(lambda: (isolation(), run_python("print(1)")))
    assert again == []
    memory = run_python("x = bytearray(600 << 20)\n", SandboxLimits(timeout_s=10.0, memory_bytes=256 << 20))
    assert memory.exit_code == 1 and "MemoryError" in memory.stderr
    forks = run_python("import os\nwhile True:\n    os.fork()\n", SandboxLimits(timeout_s=3.0, max_processes=8))
    assert "Resource temporarily unavailable" in forks.stderr
    assert run_python("while True:\n    pass\n", SandboxLimits(timeout_s=1.0)).timed_out


def test_without_bubblewrap_the_call_still_runs_bounded_and_it_warns(monkeypatch, fresh_probe, tmp_path):
    def no_bwrap(*args):
        raise FileNotFoundError("bwrap")

    monkeypatch.setattr(executor, "_bwrap_machine", no_bwrap)
    found = []
    messages = _weakened_warnings(lambda: found.append(isolation()))
    assert found[0].mode == "none"
    assert {"network", "filesystem", "pid_namespace", "seccomp"} <= set(found[0].missing)
    assert len(messages) == 1 and "mode 'none'" in messages[0]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = run_python("import os\nos.makedirs('a/b/c')\nprint(os.getcwd().startswith(os.environ['TMPDIR']))")
    assert result.stdout == "True\n", result
    assert run_python("while True:\n    pass\n", SandboxLimits(timeout_s=1.0)).timed_out
    assert os.listdir(tmp_path) == []  # the host scratch dirs were removed


def test_no_working_mode_is_a_result_not_an_exception(monkeypatch, fresh_probe):
    monkeypatch.setattr(executor, "LAUNCHER", "/nonexistent-molt-fr/launcher.py")
    with pytest.raises(SandboxSetupError, match="cannot start its interpreter on this machine in any mode"):
        isolation()
    result = run_python("print(1)")
    assert result.sandbox_error.startswith("SandboxSetupError") and not result.ok


def test_processes_of_the_calls_uid_outside_the_call_do_not_count_against_its_limit(monkeypatch):
    """A uid's process count is kernel-wide: another host sharing the kernel (a container whose
    pid gives the same uid) or a finished call still being torn down can hold processes of the
    next call's uid. The call's process limit must count only its own processes."""
    if os.geteuid() != 0 or not isolation().own_uid:
        pytest.skip("needs root, where each call runs as a uid of its own")
    if isolation().mode != "bwrap":
        pytest.skip("needs bubblewrap, whose user namespace holds the process count")
    uid = uids.UID_BASE + 7
    monkeypatch.setattr(uids, "call_uid", lambda: contextlib.nullcontext(uid))
    elsewhere = [subprocess.Popen(["sleep", "60"], user=uid, group=uid, extra_groups=[]) for _ in range(12)]
    try:
        limits = SandboxLimits(timeout_s=5.0, max_processes=8)
        assert run_python("print(1)", limits).stdout == "1\n"
        forks = run_python("import os\nwhile True:\n    os.fork()\n", limits)
        assert "Resource temporarily unavailable" in forks.stderr, forks
    finally:
        for process in elsewhere:
            process.kill()
            process.wait()
