"""The Python tool's sandbox: ``run_python`` / ``run_python_async`` and their limits (see executor.py)."""

from molt_flashreinforce.agents.sandbox.executor import (
    ExecutionResult,
    Isolation,
    SandboxLimits,
    SandboxSetupError,
    isolation,
    run_python,
    run_python_async,
)

__all__ = [
    "ExecutionResult",
    "Isolation",
    "SandboxLimits",
    "SandboxSetupError",
    "isolation",
    "run_python",
    "run_python_async",
]
