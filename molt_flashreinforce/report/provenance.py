"""Which grader and which eval sampling stand behind a run's numbers, so every number is shown with them.

Contract:
- `of_run(run, record)`: for an eval directory (`record`, eval_record.py), the grader and
  protocol it recorded. For a training run, what its evals used: the agent's grader (the math
  and Python-tool agents grade with this package's strict grader, agents/grading.py; ALFWorld's
  agent with the game's own success) and Molt's eval sampling from the run's resolved config
  (`launch/config.yaml`, else `.hydra/config.yaml`): `molt.eval.n_samples_per_prompt`,
  `temperature`, `top_p`, `max_new_tokens` (Molt falls back to the rollout's), and the agent's
  turns. The local backend's evals sample one answer per problem at `local.eval.temperature`
  and check the sum exactly.
- `of_paper(experiment)`: the same for the paper's numbers, from `protocol` in paper_results.yaml.

A value a record or config does not give is named as unknown, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from molt_flashreinforce.eval_record import GRADERS, EvalRecord, Protocol
from molt_flashreinforce.launch.records import RECORDS_SUBDIR, RESOLVED_CONFIG
from molt_flashreinforce.report.paper import Experiment
from molt_flashreinforce.report.runs import Run

AGENT_GRADERS = {"math": "strict", "python_tool": "strict", "alfworld": "alfworld"}  # agents/*.py
LOCAL_GRADER = "local"
UNKNOWN = "not stated"
GRADER_TEXT = {**GRADERS, LOCAL_GRADER: "the local backend's exact check of the sum's digits"}


@dataclass(frozen=True)
class Provenance:
    grader: str  # a key of GRADER_TEXT, or UNKNOWN
    protocol: str  # Protocol.describe() or what is known of it
    note: str = ""  # why the grader is what it is, when it is not recorded

    @property
    def grader_text(self) -> str:
        return GRADER_TEXT.get(self.grader, UNKNOWN)


def _get(config: Any, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _resolved_config(run: Run) -> dict | None:
    record = run.path / RECORDS_SUBDIR / RESOLVED_CONFIG
    if record.is_file():
        loaded = yaml.safe_load(record.read_text(encoding="utf-8"))
        if isinstance(loaded, dict):
            return loaded
    return run.config


def of_run(run: Run, record: EvalRecord | None) -> Provenance:
    if record is not None:
        return Provenance(record.grader, record.protocol.describe(), note=f"recorded by the eval ({record.engine})")
    config = _resolved_config(run)
    if config is None:
        return Provenance(UNKNOWN, f"{UNKNOWN} (no config in {run.path})")
    if _get(config, "backend") == "local":
        temperature = _get(config, "local.eval.temperature")
        sampling = f"T={temperature:g}" if isinstance(temperature, (int, float)) else "T not stated"
        return Provenance(LOCAL_GRADER, f"avg@1, {sampling}, top-p 1 (local backend)")
    if _get(config, "agent.path"):
        grader, note = UNKNOWN, f"a custom agent file ({_get(config, 'agent.path')}) grades"
    else:
        kind = _get(config, "agent.kind")
        grader, note = AGENT_GRADERS.get(kind, UNKNOWN), f"the {kind} agent's grader"
    eval_settings = {key: _get(config, f"molt.eval.{key}") for key in ("n_samples_per_prompt", "temperature", "top_p")}
    max_tokens = _get(config, "molt.eval.max_new_tokens") or _get(config, "molt.rollout.max_new_tokens")
    if None in eval_settings.values() or max_tokens is None:
        absent = [key for key, value in eval_settings.items() if value is None] + ([] if max_tokens else ["max_new_tokens"])
        return Provenance(grader, f"{UNKNOWN} (the config has no molt.eval.{', '.join(absent)})", note)
    turns = _get(config, "agent.max_turns")
    protocol = Protocol(int(eval_settings["n_samples_per_prompt"]), float(eval_settings["temperature"]),
                        float(eval_settings["top_p"]), int(max_tokens),
                        int(turns) if isinstance(turns, int) and turns > 1 else None)
    return Provenance(grader, protocol.describe(), note)


def of_paper(experiment: Experiment) -> Provenance:
    protocol = experiment.protocol
    grader = protocol.get("grader") or UNKNOWN
    note = protocol.get("grader_note", "")
    values = [protocol.get(key) for key in ("avg_at_k", "temperature", "top_p", "max_tokens")]
    if None not in values:
        turns = protocol.get("max_turns")
        return Provenance(grader, Protocol(*values, max_turns=turns).describe(), note)
    known = [f"avg@{values[0]}"] if values[0] else []
    known += [f"T={values[1]:g}"] if values[1] is not None else []
    known += [f"top-p {values[2]:g}"] if values[2] is not None else []
    return Provenance(grader, ", ".join(known + [f"sampling otherwise {UNKNOWN}"]), note)

