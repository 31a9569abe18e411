"""What an eval directory holds besides its samples, so that the report reads it as a run.

Contract (``eval_record`` is the format): ``write_config(out_dir, cfg, from_run)`` writes
``.hydra/config.yaml``, the experiment's resolved config; a base model's has no ``algo`` (no
algorithm trained it; its row belongs to every arm), a run's checkpoint keeps the run's.
``write_events(out_dir, step, scores)`` writes Molt's eval tags (``metrics.eval_pass1`` and
``metrics.eval_pass1_stderr``, as fractions) at the evaluated step into ``tensorboard/``.
``check_resumable(out_dir, record)``: an ``eval.json`` already there must describe the same
evaluation (experiment, model, protocol, grader), else ``EvalInputError``.
"""

from __future__ import annotations

import math
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from molt_flashreinforce import metrics
from molt_flashreinforce.eval_record import BenchmarkScore, EvalRecord, EvalRecordError, read_record
from molt_flashreinforce.evaluation.inputs import EvalInputError

TENSORBOARD_DIR = "tensorboard"


def write_config(out_dir: Path, cfg: DictConfig, from_run: bool) -> Path:
    config = OmegaConf.to_container(cfg, resolve=True)
    if not from_run:
        config.pop("algo", None)
    path = out_dir / ".hydra" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(config)), encoding="utf-8")
    return path


def write_events(out_dir: Path, step: int, scores: dict[str, BenchmarkScore]) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(out_dir / TENSORBOARD_DIR))
    try:
        for name, score in scores.items():
            writer.add_scalar(metrics.eval_pass1(name), score.avg, step)
            if not math.isnan(score.stderr):
                writer.add_scalar(metrics.eval_pass1_stderr(name), score.stderr, step)
    finally:
        writer.close()


def check_resumable(out_dir: Path, record: EvalRecord) -> None:
    try:
        previous = read_record(out_dir)
    except EvalRecordError as error:
        raise EvalInputError(f"{error}; pass another --out") from None
    if previous is None:
        if out_dir.is_dir() and any(out_dir.iterdir()):
            raise EvalInputError(f"--out {out_dir} is not empty and holds no eval.json; pass a new or empty directory")
        return
    for what, before, now in (("experiment", previous.experiment, record.experiment),
                              ("model", previous.model, record.model), ("protocol", previous.protocol, record.protocol),
                              ("grader", previous.grader, record.grader)):
        if before != now:
            raise EvalInputError(f"--out {out_dir} holds an evaluation with another {what} ({before}); rerun that "
                                 "one to continue it, or pass another --out")
