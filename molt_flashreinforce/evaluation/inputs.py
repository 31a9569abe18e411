"""What an evaluation runs, read from the experiment's own config: protocol, agent, benchmarks.

Contract (every function raises ``EvalInputError``, one line naming the value and the fix, and
loads no model):

* ``experiment_config(name, data_dir)``: ``conf/`` composed for ``experiment=<name>``, the config
  training renders its ``--eval.*`` flags from; ``run_config(run_dir)``: the one a run launched with.
* ``protocol_of(cfg, **overrides)``: the experiment's eval protocol as Molt's in-trainer eval
  applies it (``RLTrainer._run_eval``): ``molt.eval.{n_samples_per_prompt, temperature, top_p,
  max_new_tokens}``, each unset one falling back to ``molt.rollout.*``; the turn limit is
  ``agent.max_turns`` (multi-turn agents only); the context, ``molt.data.max_len``. A keyword
  that is not None replaces the experiment's value.
* ``agent_of(cfg, grader, max_turns)``: the experiment's agent file and the environment training
  gives it (``launch.render.agent_environment``), with the grader asked for.
* ``load_benchmarks(cfg, names, limit)``: the experiment's eval file (written by
  ``molt-flashreinforce-data``), checked row by row, as ``{datasource: rows}`` in file order.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from molt_flashreinforce.eval_record import Protocol
from molt_flashreinforce.launch.records import RECORDS_SUBDIR, RESOLVED_CONFIG

CONFIG_MODULE = "molt_flashreinforce.conf"
MULTI_TURN_AGENTS = ("python_tool", "alfworld")


class EvalInputError(ValueError):
    """Input the eval command cannot use; the message names the value and the fix."""


def experiment_names() -> list[str]:
    from importlib import resources

    folder = resources.files(CONFIG_MODULE) / "experiment"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def experiment_config(name: str, data_dir: str | None = None) -> DictConfig:
    if name not in experiment_names():
        raise EvalInputError(f"--experiment {name}: no such experiment; choose one of {', '.join(experiment_names())}")
    from hydra import compose, initialize_config_module

    overrides = [f"experiment={name}"] + ([f"data.dir={data_dir}"] if data_dir is not None else [])
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    OmegaConf.resolve(cfg)
    _check_backend(cfg, name)
    return cfg


def run_config(run_dir: Path, data_dir: str | None = None) -> DictConfig:
    """The config the run launched with (`launch/config.yaml`: for a rehearsal, the tiny model and
    the data it trained on), or Hydra's for a run the launcher did not record."""
    launched = run_dir / RECORDS_SUBDIR / RESOLVED_CONFIG
    path = launched if launched.is_file() else run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        raise EvalInputError(f"{run_dir} has no .hydra/config.yaml, so its experiment and base model are unknown; "
                             "evaluate an HF export of the checkpoint with --experiment NAME instead")
    cfg = OmegaConf.load(path)
    if data_dir is not None:
        cfg.data.dir = data_dir
        cfg.data.eval = str(Path(data_dir) / str(cfg.experiment_name) / "eval.jsonl")
    OmegaConf.resolve(cfg)
    _check_backend(cfg, str(cfg.get("experiment_name")))
    return cfg


def _check_backend(cfg: DictConfig, name: str) -> None:
    if cfg.get("backend") != "molt":
        raise EvalInputError(f"experiment {name} runs on the {cfg.get('backend')} backend, which evaluates as it trains "
                             "(its eval/ tags); this command evaluates the Molt experiments")


def _first_set(cfg: DictConfig, keys: tuple[str, ...]) -> Any:
    for key in keys:
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None:
            return value
    raise EvalInputError(f"{cfg.experiment_name} sets none of {', '.join(keys)}; set {keys[0]}=<value> in the "
                         "experiment or pass the matching option")


def _positive(option: str, value: Any, kind=int) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or (kind is int and value != int(value)):
        raise EvalInputError(f"{option} {value}: must be a positive {'integer' if kind is int else 'number'}")
    return kind(value)


def protocol_of(cfg: DictConfig, *, avg_at_k=None, temperature=None, top_p=None, max_tokens=None,
                max_turns=None) -> tuple[Protocol, int]:
    """(protocol, context length in tokens: Molt's max_len, prompt plus every turn)."""
    def pick(given, keys):
        return given if given is not None else _first_set(cfg, keys)

    k = _positive("--avg-at-k", pick(avg_at_k, ("molt.eval.n_samples_per_prompt", "molt.rollout.n_samples_per_prompt")))
    temp = pick(temperature, ("molt.eval.temperature", "molt.rollout.temperature"))
    if isinstance(temp, bool) or not isinstance(temp, (int, float)) or temp < 0:
        raise EvalInputError(f"--temperature {temp}: must be a number >= 0")
    p = _positive("--top-p", pick(top_p, ("molt.eval.top_p", "molt.rollout.top_p")), float)
    if p > 1:
        raise EvalInputError(f"--top-p {p}: must be in (0, 1]")
    tokens = _positive("--max-tokens", pick(max_tokens, ("molt.eval.max_new_tokens", "molt.rollout.max_new_tokens")))
    context = _positive("molt.data.max_len", _first_set(cfg, ("molt.data.max_len",)))
    turns = None
    if cfg.agent.kind in MULTI_TURN_AGENTS or cfg.agent.path:
        turns = _positive("--max-turns", max_turns if max_turns is not None else cfg.agent.max_turns)
    elif max_turns is not None:
        raise EvalInputError(f"--max-turns {max_turns}: the {cfg.agent.kind} agent answers in one turn; drop --max-turns")
    if tokens >= context:
        raise EvalInputError(f"--max-tokens {tokens}: must be below the context of {context} tokens "
                             "(molt.data.max_len), which also holds the prompt")
    return Protocol(avg_at_k=k, temperature=float(temp), top_p=p, max_tokens=tokens, max_turns=turns), context


@dataclass(frozen=True)
class Agent:
    file: str
    env: dict[str, str]  # what the agent reads from its environment
    grader: str  # a key of eval_record.GRADERS: the math grader asked for, or ALFWorld's success


def agent_of(cfg: DictConfig, grader: str | None, max_turns: int | None) -> Agent:
    from molt_flashreinforce.launch.checks import MATH_GRADERS, resolve_agent_file
    from molt_flashreinforce.launch.errors import LaunchError
    from molt_flashreinforce.launch.render import agent_environment

    try:
        file, problem = resolve_agent_file(cfg)
    except LaunchError as error:
        raise EvalInputError(str(error)) from None
    if problem is not None:
        raise EvalInputError(problem)
    missing = [name for name in cfg.agent.required_env if not os.environ.get(name)]
    if missing:
        raise EvalInputError(f"the {cfg.agent.kind} agent needs {', '.join(missing)} in the environment "
                             f"(agent.required_env); export {missing[0]}=<...>")
    env = agent_environment(cfg)
    if max_turns is not None:
        env["MAX_AGENT_TURNS"] = str(max_turns)
    if cfg.agent.kind == "alfworld" and not cfg.agent.path:
        if grader not in (None, "alfworld"):
            raise EvalInputError(f"--grader {grader}: the alfworld agent's reward is the game's success; drop --grader")
        env.pop("MATH_GRADER")
        return Agent(file, env, "alfworld")
    grader = grader or "strict"
    if grader not in MATH_GRADERS:
        raise EvalInputError(f"--grader {grader}: choose one of {', '.join(MATH_GRADERS)}")
    env["MATH_GRADER"] = grader
    return Agent(file, env, grader)


def _read_rows(path: Path, label_key: str) -> list[dict]:
    from molt_flashreinforce.data.schema import MalformedRowError, validate_row

    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                validate_row(row, label_key, f"{path} line {number}")
            except json.JSONDecodeError as error:
                raise EvalInputError(f"{path} line {number} is not JSON ({error.msg}); regenerate it with "
                                     "molt-flashreinforce-data") from None
            except MalformedRowError as error:
                raise EvalInputError(f"{error}; regenerate it with molt-flashreinforce-data") from None
            rows.append(row)
    return rows


def load_benchmarks(cfg: DictConfig, names: list[str] | None, limit: int | None) -> dict[str, list[dict]]:
    """{benchmark: its rows in file order}; ``limit`` keeps each benchmark's first rows."""
    experiment = cfg.experiment_name
    if cfg.data.eval is None:
        raise EvalInputError(f"experiment {experiment} has no eval set (data.eval is null)")
    path = Path(str(cfg.data.eval))
    if not path.is_file():
        raise EvalInputError(f"{path} does not exist; write it with `molt-flashreinforce-data {experiment} --out "
                             f"{cfg.data.dir}` or pass --data-dir DIR (the directory that command wrote)")
    label_key = str(OmegaConf.select(cfg, "molt.data.label_key", default="reward_model"))
    benchmarks: dict[str, list[dict]] = {}
    for row in _read_rows(path, label_key):
        benchmarks.setdefault(row["datasource"], []).append(row)
    if not benchmarks:
        raise EvalInputError(f"{path} is empty; regenerate it with molt-flashreinforce-data {experiment}")
    if names:
        unknown = [name for name in names if name not in benchmarks]
        if unknown:
            raise EvalInputError(f"--benchmarks {','.join(unknown)}: {path} has no such benchmark; it has "
                                 f"{', '.join(benchmarks)}")
        benchmarks = {name: benchmarks[name] for name in names}
    if limit is not None:
        limit = _positive("--limit", limit)
        benchmarks = {name: rows[:limit] for name, rows in benchmarks.items()}
    return benchmarks
