"""Find Hydra run directories and what each run was: its config, overrides and experiment.

Contract: `expand_run_dirs(paths)` turns each command-line path into `(run_dir, in_sweep)`
pairs: a directory with `.hydra/` (or with event files but no `.hydra/`) is one run; a
multirun sweep directory (or any directory of runs) expands to every run directory below it,
in Hydra job-number order (`in_sweep=True`). `load_run(path)` reads
`.hydra/config.yaml`, `.hydra/hydra.yaml` and `.hydra/overrides.yaml` when present.
`row_labels(runs)` names runs by the overrides that tell them apart (a single run by its
experiment and algorithm). Bad paths raise
`RunDirError` with what was expected.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from molt_flashreinforce.report.events import event_dirs

HYDRA_DIR = ".hydra"
MISSING = object()  # returned by Run.get for a key the run's config does not have


class RunDirError(ValueError):
    """A path that is not a run directory or a sweep of them."""


@dataclass(frozen=True)
class Run:
    path: Path
    config: dict[str, Any] | None = None  # the resolved Hydra config, None without .hydra/
    overrides: tuple[str, ...] = ()
    choices: dict[str, Any] = field(default_factory=dict)  # hydra.runtime.choices (config groups picked)

    def get(self, dotted_key: str) -> Any:
        """Config value at `a.b.c`, or `MISSING` when the run has no such key."""
        node: Any = self.config
        for part in dotted_key.split("."):
            if not isinstance(node, dict) or part not in node:
                return MISSING
            node = node[part]
        return node

    def experiment(self) -> str | None:
        """The experiment as recorded by the run: config, then Hydra's group choice, then overrides."""
        named = self.get("experiment_name")
        if isinstance(named, str):
            return named
        node = self.get("experiment")
        if isinstance(node, str):
            return node
        if isinstance(node, dict) and isinstance(node.get("name"), str):
            return node["name"]
        if isinstance(self.choices.get("experiment"), str):
            return self.choices["experiment"]
        for override in self.overrides:
            if _names_experiment(override) and override.partition("=")[2]:
                return override.partition("=")[2]
        return None


def _job_order(relative: Path) -> tuple[float, str]:
    # Hydra names sweep jobs `<num>` or `<num>_<override_dirname>`: sort 2 before 10.
    match = re.match(r"\d+", relative.parts[0])
    return (int(match.group()) if match else math.inf, str(relative))


def expand_run_dirs(paths: list[str | Path]) -> list[tuple[Path, bool]]:
    runs: list[tuple[Path, bool]] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise RunDirError(f"run directory {path} does not exist")
        if not path.is_dir():
            raise RunDirError(f"{path} is not a directory; pass a Hydra run directory or a multirun sweep directory")
        if (path / HYDRA_DIR).is_dir():
            runs.append((path, False))
            continue
        # Jobs may sit deeper than one level: an override value with a `/` nests Hydra's subdir.
        jobs = sorted((hydra.parent for hydra in path.rglob(HYDRA_DIR) if hydra.is_dir()),
                      key=lambda job: _job_order(job.relative_to(path)))
        if jobs:
            runs.extend((job, True) for job in jobs)
        elif event_dirs(path):
            runs.append((path, False))
        else:
            raise RunDirError(
                f"{path} is neither a run directory (no {HYDRA_DIR}/ and no TensorBoard event files below it) "
                f"nor a multirun sweep (no subdirectory with {HYDRA_DIR}/)"
            )
    return runs


def load_run(path: Path) -> Run:
    hydra_dir = path / HYDRA_DIR
    config = _load_yaml(hydra_dir / "config.yaml")
    hydra = _load_yaml(hydra_dir / "hydra.yaml") or {}
    overrides = _load_yaml(hydra_dir / "overrides.yaml") or []
    if not isinstance(overrides, list):
        raise RunDirError(f"{hydra_dir / 'overrides.yaml'} should be a list of overrides, got {type(overrides).__name__}")
    choices = hydra.get("hydra", {}).get("runtime", {}).get("choices", {}) if isinstance(hydra, dict) else {}
    return Run(path, config if isinstance(config, dict) else None, tuple(map(str, overrides)), dict(choices or {}))


def _load_yaml(path: Path) -> Any:
    if not path.is_file():
        return None
    node = OmegaConf.load(path)
    try:
        return OmegaConf.to_container(node, resolve=True)
    except Exception:  # noqa: BLE001 - `${hydra:...}` and other resolvers only exist inside a Hydra app
        return OmegaConf.to_container(node, resolve=False)


def _names_experiment(override: str) -> bool:
    return override.lstrip("+~").partition("=")[0] == "experiment"


def identity(run: Run) -> list[str]:
    """`experiment=<name> algo=<name>` as far as the run recorded them."""
    algo = run.get("algo.name")
    algo = algo if isinstance(algo, str) else run.choices.get("algo")
    parts = [f"experiment={run.experiment()}"] if run.experiment() else []
    return parts + ([f"algo={algo}"] if isinstance(algo, str) else [])


def row_labels(runs: list[Run]) -> list[str]:
    """Each run's overrides minus those every run shares and the experiment choice (the table's
    heading names it), else the directory name. A run on its own is named by its experiment and
    algorithm first (then its overrides), since nothing else tells what it was."""
    shared = set.intersection(*(set(run.overrides) for run in runs)) if len(runs) > 1 else set()
    labels = []
    for run in runs:
        distinct = [o for o in run.overrides if o not in shared and not _names_experiment(o)]
        if len(runs) == 1:
            named = {o.lstrip("+~").partition("=")[0] for o in distinct}
            distinct = [part for part in identity(run) if part.partition("=")[0] not in named] + distinct
        labels.append(" ".join(distinct) or run.path.name)
    counts = {label: labels.count(label) for label in labels}
    return [f"{label} ({run.path.name})" if counts[label] > 1 else label for label, run in zip(labels, runs)]
