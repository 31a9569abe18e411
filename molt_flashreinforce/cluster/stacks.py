"""The Python stacks of every process of a run, for a stall's post-mortem.

`dump(processes, out_dir)` runs `py-spy dump` on each process and writes what it printed to
`<out_dir>/<pid>-<name>.txt` (py-spy's error, if it could not read one). py-spy, not
faulthandler: it reads a process from the outside, so it works on the processes a stall is
about, the ones that no longer run any Python (stopped, deadlocked in a collective, spinning
in C with the GIL held), with nothing installed in them beforehand. It needs ptrace rights over
the process (same user, and a yama ptrace_scope of 0, or root; containers may need
SYS_PTRACE). `dump_descendants(out_dir)` does it for everything below this process.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psutil

DUMP_TIMEOUT_S = 20.0


def _py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def dump(processes: list[psutil.Process], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    py_spy = _py_spy()
    written = []
    for process in processes:
        try:
            name = process.name().replace("/", "_").replace(" ", "_")
            argv = process.cmdline()
        except psutil.Error:
            continue
        command = " ".join(argv)
        titled = name.startswith(("ray::", "VLLM::"))  # Ray's workers; vLLM's EngineCore and Worker processes
        if not (titled or Path(argv[0] if argv else "").name.startswith("python")):
            continue  # raylet, gcs_server, shells: no Python stack to read
        if py_spy is None:
            text = "py-spy is not installed (pip install py-spy)\n"
        else:
            done = subprocess.run([py_spy, "dump", "--nonblocking", "--pid", str(process.pid)],
                                  capture_output=True, text=True, timeout=DUMP_TIMEOUT_S, check=False)
            text = done.stdout + done.stderr
        path = out_dir / f"{process.pid}-{name}.txt"
        path.write_text(f"# {command}\n{text}")
        written.append(path)
    return written


def dump_descendants(out_dir: Path) -> list[Path]:
    return dump(psutil.Process().children(recursive=True), out_dir)
