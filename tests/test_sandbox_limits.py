"""The sandbox's settings, its model-facing error texts, and its weakened fallback mode.

All calls run real processes. The fallback test makes the executor believe it is not root
(``os.geteuid`` patched for that test), so the unprivileged path really runs:
a user + network namespace without the per-call uid, PID namespace or read-only mounts.
"""

from __future__ import annotations

import socket
import warnings

import pytest

from molt_flashreinforce.agents.sandbox import ExecutionResult, SandboxLimits, SandboxSetupError, executor, run_python


def test_limits_follow_molts_environment_names():
    limits = SandboxLimits.from_env(
        {"PYTHON_EXECUTOR_TIMEOUT": "2.5", "PYTHON_EXECUTOR_MEM_BYTES": "536870912", "PYTHON_EXECUTOR_OUTPUT_CHARS": "100"}
    )
    assert (limits.timeout_s, limits.memory_bytes, limits.output_chars) == (2.5, 1 << 29, 100)
    assert SandboxLimits.from_env({}) == SandboxLimits()
    with pytest.raises(ValueError, match="Bad PYTHON_EXECUTOR_\\* setting"):
        SandboxLimits.from_env({"PYTHON_EXECUTOR_TIMEOUT": "ten"})


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


def test_setup_failures_raise_instead_of_blaming_the_code(monkeypatch):
    if executor.isolation().mode != "namespaces":
        pytest.skip("needs the namespace mode, whose setup exposes the interpreter's directories")
    monkeypatch.setattr(executor, "_exposed_paths", lambda: ["/nonexistent-molt-fr/python"])
    with pytest.raises(SandboxSetupError, match="sandbox setup failed"):
        run_python("print(1)")


def test_unprivileged_fallback_warns_loudly_and_still_blocks_the_network(monkeypatch):
    monkeypatch.setattr(executor.os, "geteuid", lambda: 1000)
    executor.isolation.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            iso = executor.isolation()
        if iso.mode == "none":
            pytest.skip("this kernel refuses user namespaces")
        assert iso.mode == "user-network" and iso.network
        assert iso.missing == ["filesystem", "pid_namespace", "own_uid"]
        assert any("PYTHON SANDBOX IS WEAKENED" in str(w.message) for w in caught)
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            port = server.getsockname()[1]
            code = f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('CONNECTED')\nexcept OSError as e:\n    print('refused')\n"
            result = run_python(code, SandboxLimits(timeout_s=5))
        assert result.stdout == "refused\n"
        loop = run_python("while True:\n    pass\n", SandboxLimits(timeout_s=1))
        assert loop.timed_out
    finally:
        executor.isolation.cache_clear()
