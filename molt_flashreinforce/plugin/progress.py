"""A run's progress as files, and a Molt checkpoint on request, from inside Molt's workers.

When MOLT_FLASHREINFORCE_PROGRESS_DIR names a directory (the supervisor, `cluster.supervisor`,
sets it for every attempt and forwards it to the workers), `install()` (idempotent, run in every
Ray worker by our setup hook) patches two Molt classes:

* `TrainingActor.save_logs_and_checkpoints`, which Molt calls once per optimizer step: after it,
  `step.json` holds the step that just ended and the time. When `checkpoint_request` holds a
  request id not answered yet, that call saves a checkpoint through Molt's own path (as if
  `--ckpt.save_steps` divided this step: the same DCP save, `latest` and rotation), and
  `checkpoint_done.json` then answers it with the step saved. That is the next step boundary
  after the request: a step in progress is finished first, never cut.
* `SamplesGenerator._filter_group`, which Molt calls for each finished rollout group: it touches
  `rollout`, at most once a second. A finished rollout is our reading of "tokens were generated":
  Molt's HTTP path to vLLM reports nothing finer, so a stall timeout must exceed the longest
  rollout of the experiment.

Files are replaced atomically (a reader on another node never sees half of one). Without the
variable nothing is patched in and Molt runs as it would.

`defer_slurm_signals()` (run by the setup hook in every Ray worker under the supervisor): SLURM
signals every process of a job step at once, Ray's workers included, and a worker exits on
SIGTERM (Ray's task loop installs a handler that raises SystemExit; the signal mask our launcher
blocks does not reach them through the raylet) and on SIGUSR2 (the default action). The signals are
the supervisor's to act on, so a worker ignores both: the checkpoint it asks for needs the workers
alive. Stopping a run still works: the supervisor's teardown sends SIGINT, then SIGKILL.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from pathlib import Path

from molt_flashreinforce.plugin.patching import patch_once

PROGRESS_DIR_VARIABLE = "MOLT_FLASHREINFORCE_PROGRESS_DIR"
STEP_FILE = "step.json"
ROLLOUT_FILE = "rollout"
REQUEST_FILE = "checkpoint_request"
DONE_FILE = "checkpoint_done.json"
_ROLLOUT_TOUCH_EVERY_S = 1.0
_INSTALLED_MARK = "_molt_flashreinforce_progress"


def progress_dir() -> Path | None:
    value = os.environ.get(PROGRESS_DIR_VARIABLE)
    return Path(value) if value else None


def write_json(path: Path, fields: dict) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(fields))
    partial.replace(path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def pending_request(where: Path) -> str | None:
    """The id of a checkpoint request not answered yet."""
    request = read_json(where / REQUEST_FILE)
    if request is None:
        return None
    done = read_json(where / DONE_FILE) or {}
    return None if done.get("id") == request.get("id") else request.get("id")


def _patch_trainer(trainer_class) -> None:
    save = trainer_class.save_logs_and_checkpoints

    @functools.wraps(save)
    def save_reporting_progress(self, global_step: int, logs_dict=None, client_states=None):
        where = progress_dir()
        request = pending_request(where) if where else None
        if request is None:
            save(self, global_step, logs_dict, client_states)
        else:
            every = self.args.ckpt.save_steps
            self.args.ckpt.save_steps = global_step  # Molt saves when save_steps divides the step
            try:
                save(self, global_step, logs_dict, client_states)
            finally:
                self.args.ckpt.save_steps = every
        if where is not None:
            write_json(where / STEP_FILE, {"step": int(global_step), "time": time.time()})
            if request is not None:
                write_json(where / DONE_FILE, {"id": request, "step": int(global_step)})

    trainer_class.save_logs_and_checkpoints = save_reporting_progress


def _patch_generator(generator_class) -> None:
    filter_group = generator_class._filter_group
    last_touch = [0.0]

    @functools.wraps(filter_group)
    def filter_group_reporting_progress(self, *args, **kwargs):
        samples = filter_group(self, *args, **kwargs)
        where = progress_dir()
        now = time.monotonic()
        if where is not None and now - last_touch[0] >= _ROLLOUT_TOUCH_EVERY_S:
            last_touch[0] = now
            (where / ROLLOUT_FILE).touch()
        return samples

    generator_class._filter_group = filter_group_reporting_progress


def install() -> None:
    """Patch Molt's trainer actor and generator classes in this process (idempotent; see
    plugin/policy_lag.py for why the actor's captured class is the one patched)."""
    if progress_dir() is None:
        return
    from molt.trainer import rl_trainer
    from molt.trainer.rollout.samples_generator import SamplesGenerator

    patch_once(((rl_trainer.TrainingActor.__ray_metadata__.modified_class, _patch_trainer),
                (SamplesGenerator, _patch_generator)), _INSTALLED_MARK)


def defer_slurm_signals() -> None:
    """In a Ray worker of a supervised run: SIGTERM and SIGUSR2 leave it running (see above)."""
    if progress_dir() is None:
        return
    import ray._private.utils

    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Ray's task loop sets its SIGTERM handler after the setup hook has run: it must not.
    ray._private.utils.set_sigterm_handler = lambda handler: None
