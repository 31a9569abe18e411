"""``ExecutionResult``: what one sandbox call produced, and the text the model reads back."""

from __future__ import annotations

import signal
from dataclasses import dataclass

_SIGNALS = {s.value for s in signal.Signals}


@dataclass(frozen=True)
class ExecutionResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when the sandbox killed the call or could not start it
    timed_out: bool
    output_exceeded: bool
    elapsed_s: float
    # Set when the sandbox itself failed (not the program): the program may not have run.
    sandbox_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_exceeded and self.sandbox_error is None

    def observation(self, output_chars: int) -> str:
        """What the model reads back: the output, truncated, plus a plain error line."""
        if self.sandbox_error is not None:
            # The details are for the operator's log; the model only learns it was not its fault.
            return "Error: the sandbox failed to run this program (an internal error, not your code); try again."
        parts = []
        if self.stdout:
            parts.append(_truncate(self.stdout, output_chars))
        if self.stderr:
            parts.append("[stderr]\n" + _truncate(self.stderr, output_chars))
        if self.timed_out:
            parts.append(f"Error: execution timed out after {self.elapsed_s:.1f} s and was killed.")
        elif self.output_exceeded:
            parts.append("Error: the program printed too much output and was killed.")
        elif self.exit_code is not None and self.exit_code > 128:
            name = signal.Signals(self.exit_code - 128).name if self.exit_code - 128 in _SIGNALS else "a signal"
            parts.append(f"Error: the program was killed by {name} (a resource limit was hit).")
        elif self.exit_code:
            parts.append(f"Error: the program exited with status {self.exit_code}.")
        return "\n".join(parts) if parts else "(no output)"


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [output truncated to {limit} characters]"
