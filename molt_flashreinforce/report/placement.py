"""The GPUs a run held, read from the run record our launcher writes (`<run_dir>/launch/config.yaml`).

Contract: `read_placement(run_dir) -> Placement`. `gpus` is the number of GPUs the run's
processes claimed, or None when it held none or has no record (`missing` says which);
`dp_ranks` is the number of data-parallel training ranks of a Molt run (None otherwise);
`describe` names the split. A run directory without the record is not an error (its
GPU-hours are n/a); a record that is not valid YAML raises `RunDirError`.

A Molt run holds what Molt's own GPU count in `molt/cli/train_rl_ray.py` (its over-subscription
check) adds up: the actor's `num_nodes x num_gpus_per_node`, plus the vLLM engines'
`num_engines x tensor_parallel_size x pipeline_parallel_size x data_parallel_size`. Its
reference and critic terms are 0 for our launcher: both algorithms render
`--algo.kl.init_coef 0` (no reference workers) and neither uses the GAE estimator (no critic).
A CPU rehearsal's GPUs are logical Ray resources, and the local backend holds one GPU only
when `local.device` is a CUDA device.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from molt_flashreinforce.launch.records import RECORDS_SUBDIR, RESOLVED_CONFIG
from molt_flashreinforce.report.runs import RunDirError

RECORD = f"{RECORDS_SUBDIR}/{RESOLVED_CONFIG}"
MOLT_DEFAULT_PARALLEL = 1  # Molt's default --vllm.pipeline_parallel_size and --vllm.data_parallel_size


@dataclass(frozen=True)
class Placement:
    gpus: int | None
    dp_ranks: int | None = None
    describe: str = ""
    missing: str | None = None  # why `gpus` is None


def read_placement(run_dir: Path) -> Placement:
    path = run_dir / RECORD
    if not path.is_file():
        return Placement(None, missing=f"no run record {RECORD}")
    try:
        record = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise RunDirError(f"{path} is not valid YAML ({err}); it is the run record the launcher wrote") from None
    if not isinstance(record, dict):
        return Placement(None, missing=f"{RECORD} holds no config")
    if record.get("backend") == "local":
        return _local(record)
    return _molt(record)


def _local(record: dict[str, Any]) -> Placement:
    device = str(_get(record, "local.device") or "cpu")
    if device.startswith("cuda"):
        return Placement(1, describe=f"1 GPU (local.device={device})")
    return Placement(None, missing=f"a CPU run (local.device={device})")


def _molt(record: dict[str, Any]) -> Placement:
    keys = ("placement.actor.nodes", "placement.actor.gpus_per_node", "placement.actor.tp", "placement.actor.cp",
            "placement.vllm.engines", "placement.vllm.tp")
    values = {key: _get(record, key) for key in keys}
    absent = [key for key, value in values.items() if not isinstance(value, int)]
    if absent:
        return Placement(None, missing=f"{RECORD} has no integer {', '.join(absent)}")
    actor_gpus = values["placement.actor.nodes"] * values["placement.actor.gpus_per_node"]
    # Molt's get_model_parallel_size: tp x cp ranks share one data shard (EP does not divide it).
    dp_ranks = actor_gpus // (values["placement.actor.tp"] * values["placement.actor.cp"])
    engine_gpus = values["placement.vllm.tp"]
    for key in ("molt.vllm.pipeline_parallel_size", "molt.vllm.data_parallel_size"):
        engine_gpus *= int(_get(record, key) or MOLT_DEFAULT_PARALLEL)
    vllm_gpus = values["placement.vllm.engines"] * engine_gpus
    describe = (f"{actor_gpus + vllm_gpus} GPUs (actor {values['placement.actor.nodes']} node(s) x "
                f"{values['placement.actor.gpus_per_node']}, vLLM {values['placement.vllm.engines']} engines x {engine_gpus})")
    if _get(record, "rehearsal.mode") == "cpu":
        return Placement(None, dp_ranks, describe, missing="a CPU rehearsal (its GPUs are logical Ray resources)")
    return Placement(actor_gpus + vllm_gpus, dp_ranks, describe)


def _get(record: dict[str, Any], dotted_key: str) -> Any:
    node: Any = record
    for part in dotted_key.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node
