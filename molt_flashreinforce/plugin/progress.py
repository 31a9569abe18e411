"""A run's progress as files, and a Molt checkpoint on request, from inside Molt's workers.

The workers' side of the progress files (cluster/progress.py). When MOLT_FLASHREINFORCE_PROGRESS_DIR
names a directory, `HOOKS` (at Molt's seams, plugin/seams.py, in every Ray worker):

* at the end of each optimizer step (Molt's `save_logs_and_checkpoints`), `step.json` holds the
  step that just ended and the time. When `checkpoint_request` holds a request id not answered
  yet, that step saves a checkpoint through Molt's own path (the same DCP save, `latest` and
  rotation), and `checkpoint_done.json` then answers it with the step saved. That is the next
  step boundary after the request: a step in progress is finished first, never cut.
* for each finished rollout group it touches `rollout`, at most once a second. A finished
  rollout is our reading of "tokens were generated": Molt's HTTP path to vLLM reports nothing
  finer, so a stall timeout must exceed the longest rollout of the experiment.

Without the variable the hooks do nothing and Molt runs as it would.

`defer_slurm_signals()` (run by the setup hook in every Ray worker under the supervisor): SLURM
signals every process of a job step at once, Ray's workers included, and a worker exits on
SIGTERM (Ray's task loop installs a handler that raises SystemExit; the signal mask our launcher
blocks does not reach them through the raylet) and on SIGUSR2 (the default action). The signals are
the supervisor's to act on, so a worker ignores both: the checkpoint it asks for needs the workers
alive (plugin/slurm_signals.py, which also keeps vLLM's engine processes alive). Stopping a run still
works: the supervisor's teardown sends SIGINT, then SIGKILL.
"""

from __future__ import annotations

import time

from molt_flashreinforce.cluster.progress import (DONE_FILE, ROLLOUT_FILE, STEP_FILE, pending_request, progress_dir,
                                                  write_json)
from molt_flashreinforce.plugin import seams
from molt_flashreinforce.plugin.seams import RuntimeHooks
from molt_flashreinforce.plugin.slurm_signals import ignore_slurm_signals

_ROLLOUT_TOUCH_EVERY_S = 1.0


class Progress(RuntimeHooks):
    """Progress's part at Molt's seams (plugin/seams.py); inert without a progress directory."""

    def __init__(self) -> None:
        self._last_touch = 0.0

    def collected(self, generator, finished, samples, drop_counts):
        where = progress_dir()
        now = time.monotonic()
        if where is not None and now - self._last_touch >= _ROLLOUT_TOUCH_EVERY_S:
            self._last_touch = now
            (where / ROLLOUT_FILE).touch()
        return samples

    def checkpoint_wanted(self, trainer, global_step) -> bool:
        where = progress_dir()
        return where is not None and pending_request(where) is not None

    def step_ended(self, trainer, global_step, checkpoint_saved) -> None:
        where = progress_dir()
        if where is None:
            return
        request = pending_request(where)
        write_json(where / STEP_FILE, {"step": int(global_step), "time": time.time()})
        if request is not None and checkpoint_saved:
            write_json(where / DONE_FILE, {"id": request, "step": int(global_step)})


HOOKS = Progress()


def defer_slurm_signals() -> None:
    """In a Ray worker of a supervised run: SIGTERM and SIGUSR2 leave it running (see above)."""
    if progress_dir() is None:
        return
    ignore_slurm_signals()
    seams.keep_ray_from_handling_sigterm()
