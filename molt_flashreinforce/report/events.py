"""Read a run's TensorBoard scalars with TensorBoard's own `EventAccumulator`.

Contract: `read_scalars(run_dir)` finds every directory below `run_dir` that holds event files
(`<run_dir>/tensorboard/` for the local backend, `<run_dir>/tensorboard/<run_name>/` for Molt),
loads all their scalars and returns `{tag: ((step, value), ...)}` sorted by step. When one
step of one tag was written more than once (a resumed run), the latest write wins. An eval
directory below the run (its own `eval.json`, eval_record.py) is a run of its own: its events are
not the run's. Raises `NoEventFilesError` when there are none.
"""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing import event_accumulator

from molt_flashreinforce.eval_record import RECORD_NAME

EVENT_FILE_GLOB = "events.out.tfevents.*"

Series = tuple[tuple[int, float], ...]


class NoEventFilesError(FileNotFoundError):
    """A run directory without TensorBoard event files."""


def _in_nested_eval(directory: Path, run_dir: Path) -> bool:
    """Whether `directory` lies in an eval directory below `run_dir` (run_dir itself may be one)."""
    relative = directory.relative_to(run_dir)
    return any((run_dir / part / RECORD_NAME).is_file() for part in (relative, *relative.parents) if part != Path("."))


def event_dirs(run_dir: Path) -> list[Path]:
    found = {path.parent for path in run_dir.rglob(EVENT_FILE_GLOB) if path.is_file()}
    return sorted(directory for directory in found if not _in_nested_eval(directory, run_dir))


def read_scalars(run_dir: str | Path) -> dict[str, Series]:
    run_dir = Path(run_dir)
    dirs = event_dirs(run_dir)
    if not dirs:
        raise NoEventFilesError(
            f"no TensorBoard event files ({EVENT_FILE_GLOB}) under {run_dir}; pass a run directory whose "
            "training wrote to <run_dir>/tensorboard (Molt: --logger.tensorboard_dir)"
        )
    latest: dict[str, dict[int, tuple[float, float]]] = {}  # tag -> step -> (wall_time, value)
    for directory in dirs:
        # size_guidance 0 keeps every scalar event instead of TensorBoard's default reservoir sample.
        accumulator = event_accumulator.EventAccumulator(
            str(directory), size_guidance={event_accumulator.SCALARS: 0}
        )
        accumulator.Reload()
        for tag in accumulator.Tags()[event_accumulator.SCALARS]:
            by_step = latest.setdefault(tag, {})
            for event in accumulator.Scalars(tag):
                previous = by_step.get(event.step)
                if previous is None or event.wall_time >= previous[0]:
                    by_step[event.step] = (event.wall_time, float(event.value))
    return {tag: tuple((step, by_step[step][1]) for step in sorted(by_step)) for tag, by_step in latest.items()}
