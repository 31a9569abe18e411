"""The Python tool's sandbox: ``run_python`` / ``run_python_async``, their limits and result (see executor.py)."""

from molt_flashreinforce.agents.sandbox.executor import (
    Isolation,
    SandboxSetupError,
    isolation,
    run_python,
    run_python_async,
)
from molt_flashreinforce.agents.sandbox.limits import SandboxLimits
from molt_flashreinforce.agents.sandbox.result import ExecutionResult

__all__ = [
    "ExecutionResult",
    "Isolation",
    "SandboxLimits",
    "SandboxSetupError",
    "isolation",
    "run_python",
    "run_python_async",
]
