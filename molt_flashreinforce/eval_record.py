"""The record an evaluation leaves, in one format that the eval command writes and the report reads.

An eval directory is a run directory to the report:

* ``eval.json``: an ``EvalRecord``: what was evaluated (``ModelRef``), under which ``Protocol``
  and grader, and the per-benchmark table (``BenchmarkScore``);
* ``samples.jsonl``: one JSON object per sample with the keys ``SAMPLE_KEYS``;
* ``tensorboard/``: Molt's eval tags at the evaluated step (``metrics.eval_pass1`` and
  ``metrics.eval_pass1_stderr``; step 0 for a base model), so a checkpoint's row sits beside
  its training run's;
* ``.hydra/config.yaml``: the experiment's resolved config (``experiment_name``, and the
  training run's ``algo`` when the model came from a run).

``write_record`` replaces ``eval.json`` atomically; ``read_record`` returns None for a directory
that holds none and raises ``EvalRecordError`` naming the file for one it cannot read.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

RECORD_NAME = "eval.json"
SAMPLES_NAME = "samples.jsonl"
SCHEMA_VERSION = 1
# grader name -> what it is, as printed beside every number
GRADERS = {
    "strict": "this package's strict grader (last \\boxed{}, math-verify on a whole parse)",
    "molt": "Molt's example math grader's rules (last \\boxed{}, else 'answer is', else the last number)",
    "alfworld": "ALFWorld's own success signal (the game's goal reached)",
}
MODEL_KINDS = ("hf_id", "hf_dir", "molt_checkpoint")
SAMPLE_KEYS = ("benchmark", "problem_id", "sample_index", "response", "extracted_answer", "reward", "verdict",
               "turns", "tool_calls")


class EvalRecordError(ValueError):
    """An eval.json that cannot be read as this schema."""


@dataclass(frozen=True)
class ModelRef:
    kind: str  # one of MODEL_KINDS
    path: str  # Hugging Face id, HF directory or Molt checkpoint directory, as given
    step: int  # training step of those weights; 0 for a base model
    run_dir: str | None = None  # the training run the checkpoint came from, when known


@dataclass(frozen=True)
class Protocol:
    avg_at_k: int
    temperature: float
    top_p: float
    max_tokens: int
    max_turns: int | None = None

    def describe(self) -> str:
        turns = f", {self.max_turns} turns" if self.max_turns else ""
        return f"avg@{self.avg_at_k}, T={self.temperature:g}, top-p {self.top_p:g}, {self.max_tokens} tokens{turns}"


@dataclass(frozen=True)
class BenchmarkScore:
    avg: float  # avg@k as a fraction: mean over problems of the mean reward of the k samples
    stderr: float  # standard error of `avg` over problems
    problems: int
    samples: int
    tool_calls_mean: float | None = None
    turns_mean: float | None = None


@dataclass(frozen=True)
class EvalRecord:
    experiment: str
    model: ModelRef
    protocol: Protocol
    grader: str  # a key of GRADERS
    engine: str  # e.g. "vllm 0.32.0 (cpu)"
    benchmarks: dict[str, BenchmarkScore] = field(default_factory=dict)
    complete: bool = False  # every sample of every benchmark graded
    schema_version: int = SCHEMA_VERSION

    @property
    def mean(self) -> float | None:
        scores = [score.avg for score in self.benchmarks.values()]
        return sum(scores) / len(scores) if scores else None


def write_record(directory: str | Path, record: EvalRecord) -> Path:
    path = Path(directory) / RECORD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(asdict(record), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return path


def read_record(directory: str | Path) -> EvalRecord | None:
    path = Path(directory) / RECORD_NAME
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("schema_version") != SCHEMA_VERSION:
            raise EvalRecordError(f"{path}: schema_version {raw.get('schema_version')!r}, this package reads "
                                  f"{SCHEMA_VERSION}; re-run molt-flashreinforce-eval with this version")
        if raw["grader"] not in GRADERS:
            raise EvalRecordError(f"{path}: grader {raw['grader']!r} is not one of {', '.join(GRADERS)}")
        return EvalRecord(
            experiment=raw["experiment"], model=ModelRef(**raw["model"]), protocol=Protocol(**raw["protocol"]),
            grader=raw["grader"], engine=raw["engine"],
            benchmarks={name: BenchmarkScore(**score) for name, score in raw["benchmarks"].items()},
            complete=raw["complete"], schema_version=raw["schema_version"])
    except (KeyError, TypeError, json.JSONDecodeError) as err:
        raise EvalRecordError(f"{path}: not an eval record of schema {SCHEMA_VERSION} ({err!r})") from None
