"""Resource bounds of one sandbox call (``SandboxLimits``), read from Molt's environment names."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class SandboxLimits:
    """Bounds of one call. ``memory_bytes``, ``max_processes`` and ``cpus`` bound the whole call
    (its cgroup) where cgroups work; the rlimits bound each process everywhere."""

    timeout_s: float = 10.0
    memory_bytes: int = 1 << 30
    max_processes: int = 64
    cpus: float = 1.0
    max_file_bytes: int = 16 << 20
    scratch_bytes: int = 64 << 20  # size of the call's scratch tmpfs: its whole disk
    max_open_files: int = 64
    output_chars: int = 2048
    max_output_bytes: int = 1 << 20  # past this the call is killed, not just truncated

    @classmethod
    def from_env(cls, environ=None) -> SandboxLimits:
        environ = os.environ if environ is None else environ
        defaults = cls()
        try:
            return cls(
                timeout_s=float(environ.get("PYTHON_EXECUTOR_TIMEOUT", defaults.timeout_s)),
                memory_bytes=int(environ.get("PYTHON_EXECUTOR_MEM_BYTES", defaults.memory_bytes)),
                output_chars=int(environ.get("PYTHON_EXECUTOR_OUTPUT_CHARS", defaults.output_chars)),
            )
        except ValueError as exc:
            raise ValueError(
                f"Bad PYTHON_EXECUTOR_* setting ({exc}): TIMEOUT takes seconds, MEM_BYTES and OUTPUT_CHARS integers."
            ) from exc
