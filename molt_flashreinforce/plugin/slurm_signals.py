"""SLURM's signals belong to the supervisor, in every other process of a supervised run.

SLURM signals every process of a job step at once: preemption's SIGTERM, and SIGUSR2 before the
time limit (`--signal=USR2@...`). Under the supervisor (cluster/supervisor.py, which sets
MOLT_FLASHREINFORCE_PROGRESS_DIR) the answer to either is a checkpoint at the next step boundary,
and that needs every process alive:

    ignore_slurm_signals()   SIGTERM and SIGUSR2 ignored under the supervisor; a no-op otherwise

It runs in every Ray worker (plugin/progress.py `defer_slurm_signals`) and, as a vLLM general plugin
(entry point `vllm.general_plugins` in pyproject.toml), in vLLM's own processes. vLLM's EngineCore
and Worker processes install SIGTERM handlers that shut the engine down (vLLM 0.32.0:
`v1/engine/core.py` `run_engine_core`, `v1/executor/multiproc_executor.py` `worker_main`), so the
SIG_IGN they inherit from the Ray worker does not hold. They load general plugins after installing
those handlers, on their main thread, in the fresh interpreter that vLLM's spawn start method (forced
inside a Ray actor) gives them, so this plugin's ignore wins. A `VLLM_PLUGINS` allow-list must name
`molt_flashreinforce_slurm_signals`.

Stopping a run still works. The supervisor's teardown sends SIGINT, then SIGKILL, and vLLM's own
shutdown waits for its processes, then kills what is left.
"""

from __future__ import annotations

import signal
import threading

from molt_flashreinforce.cluster.progress import progress_dir

SLURM_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


def ignore_slurm_signals() -> None:
    # vLLM also loads its plugins off the main thread (e.g. in the engine actor's AsyncEngineArgs),
    # where a handler cannot be set; that process's own main thread has already ignored both.
    if progress_dir() is None or threading.current_thread() is not threading.main_thread():
        return
    for signum in SLURM_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
