"""The `local:` config node of the CPU backend, as typed, validated dataclasses.

    LocalConfig.from_node(cfg.local)   # OmegaConf node, dict, or None (-> a clear error)
    check(cfg)                         # the whole composed config, as the CLI validates it

Every field has a default (the `tiny` experiment's values live in conf/experiment/tiny.yaml).
Unknown keys and out-of-range values raise `LocalConfigError`: one line with the full key
(`local.steps`), the bad value and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from omegaconf import OmegaConf


class LocalConfigError(ValueError):
    """The `local:` node is missing or holds a bad value."""


@dataclass(frozen=True)
class TaskConfig:
    max_operand: int = 99  # operands are drawn from [0, max_operand]; answers have 1..digits(2*max) digits
    datasource: str = "tiny"  # the eval metric is eval/eval_<datasource>_pass1, as in Molt
    eval_size: int = 512  # held-out problems, never used for training
    eval_seed: int = 1234  # fixes the held-out set independently of the run seed


@dataclass(frozen=True)
class ModelConfig:
    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4


@dataclass(frozen=True)
class WarmStartConfig:
    steps: int = 300  # supervised (teacher-forced) updates before RL; 0 = start from random weights
    batch_size: int = 128
    lr: float = 3e-3
    # Stop early once the policy's sampled pass@1 on `check_size` training problems reaches this
    # (checked every `check_every` steps), so that RL starts from a like point whatever the seed
    # or machine; null: always run `steps`.
    target_pass1: float | None = None
    check_every: int = 25
    check_size: int = 512
    cache_dir: str | None = None  # share finished warm starts between runs (local/warm_start_cache.py)


@dataclass(frozen=True)
class EvalConfig:
    every: int = 25  # updates between evals; evals also run at step 0 and at the end
    temperature: float = 1.0  # Molt's eval temperature falls back to the rollout temperature


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 100  # updates between checkpoints; one is always written at the end
    keep_last: int = 2


@dataclass(frozen=True)
class LocalConfig:
    device: str = "cpu"
    num_threads: int = 1  # torch intra-op threads: a model this small runs fastest on one
    steps: int = 300  # optimizer steps = fresh rollout batches
    rollouts_per_step: int = 128  # B trajectories per update (prompts per update = B / group_size)
    policy_lag: int = 0  # rollouts come from the policy exactly this many updates old (0 = on-policy)
    temperature: float = 1.0  # rollout sampling temperature (top-p 1, no truncation)
    lr: float = 3e-4
    weight_decay: float = 0.1
    adam_betas: tuple[float, float] = (0.9, 0.95)  # Molt's default betas
    max_grad_norm: float = 1.0
    progress_bar: bool = True
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self) -> None:
        _positive("local.steps", self.steps)
        _positive("local.rollouts_per_step", self.rollouts_per_step)
        _positive("local.num_threads", self.num_threads)
        if not isinstance(self.policy_lag, int) or self.policy_lag < 0:
            raise LocalConfigError(f"local.policy_lag={self.policy_lag} must be an integer >= 0; use local.policy_lag=0 "
                                   "for on-policy rollouts")
        for name in ("temperature", "lr", "max_grad_norm"):
            _positive_float(f"local.{name}", getattr(self, name))
        _positive_float("local.eval.temperature", self.eval.temperature)
        _positive_float("local.warm_start.lr", self.warm_start.lr)
        if self.weight_decay < 0:
            raise LocalConfigError(f"local.weight_decay={self.weight_decay} must be >= 0; e.g. local.weight_decay=0.1")
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
            raise LocalConfigError(f"local.adam_betas={list(self.adam_betas)} must be two numbers in [0, 1); "
                                   "e.g. local.adam_betas=[0.9,0.95]")
        _positive("local.task.max_operand", self.task.max_operand)
        _positive("local.task.eval_size", self.task.eval_size)
        if self.task.eval_size > (self.task.max_operand + 1) ** 2 // 2:
            raise LocalConfigError(
                f"local.task.eval_size={self.task.eval_size} holds out more than half of the "
                f"{(self.task.max_operand + 1) ** 2} problems; lower it or raise local.task.max_operand"
            )
        for name in ("n_layer", "n_embd", "n_head"):
            _positive(f"local.model.{name}", getattr(self.model, name))
        if self.model.n_embd % self.model.n_head:
            raise LocalConfigError(
                f"local.model.n_embd={self.model.n_embd} must be divisible by local.model.n_head={self.model.n_head}"
            )
        if self.warm_start.steps < 0:
            raise LocalConfigError(f"local.warm_start.steps={self.warm_start.steps} must be an integer >= 0; "
                                   "use local.warm_start.steps=0 to skip the warm start")
        _positive("local.warm_start.batch_size", self.warm_start.batch_size)
        _positive("local.warm_start.check_every", self.warm_start.check_every)
        _positive("local.warm_start.check_size", self.warm_start.check_size)
        target = self.warm_start.target_pass1
        if target is not None and not (_is_number(target) and 0 < target <= 1):
            raise LocalConfigError(f"local.warm_start.target_pass1={target} must be in (0, 1] or null; "
                                   "e.g. local.warm_start.target_pass1=0.4")
        _positive("local.eval.every", self.eval.every)
        _positive("local.checkpoint.every", self.checkpoint.every)
        _positive("local.checkpoint.keep_last", self.checkpoint.keep_last)

    @classmethod
    def from_node(cls, node: Any) -> "LocalConfig":
        if node is None:
            raise LocalConfigError(
                "backend=local needs the `local:` config node; run `molt-flashreinforce experiment=tiny` "
                "(conf/experiment/tiny.yaml sets it) or pass local.* overrides"
            )
        return _build(cls, _plain(node), "local")


def check(cfg: Any) -> LocalConfig:
    """`cfg.local`, and how it fits the `algo` node: raises `LocalConfigError` in one line."""
    local = LocalConfig.from_node(cfg.get("local"))
    if local.rollouts_per_step % cfg.algo.group_size:
        raise LocalConfigError(
            f"local.rollouts_per_step={local.rollouts_per_step} is not a multiple of algo.group_size="
            f"{cfg.algo.group_size} (each prompt gets a whole group); set local.rollouts_per_step to a multiple of it")
    bound = cfg.algo.get("max_policy_lag")
    if bound is not None and local.policy_lag > bound:
        raise LocalConfigError(
            f"local.policy_lag={local.policy_lag} exceeds algo.max_policy_lag={bound}: every local batch is exactly "
            f"local.policy_lag updates old; lower local.policy_lag to at most {bound} or raise algo.max_policy_lag")
    return local


def _plain(node: Any) -> Any:
    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _build(cls, values: Mapping[str, Any], prefix: str):
    if not isinstance(values, Mapping):
        raise LocalConfigError(f"{prefix}={values} must be a mapping of settings (see conf/experiment/tiny.yaml)")
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"did you mean {prefix}.{close[0]}?" if close else f"{prefix} has: {', '.join(sorted(known))}"
        raise LocalConfigError(f"{prefix}.{unknown[0]} is not a key of the CPU backend's config; {hint}")
    kwargs = {}
    for name, value in values.items():
        nested = known[name].default_factory if known[name].default_factory is not dataclasses.MISSING else None
        if nested is not None and dataclasses.is_dataclass(nested):
            kwargs[name] = _build(nested, value or {}, f"{prefix}.{name}")
        elif name == "adam_betas":
            if not isinstance(value, (list, tuple)) or not all(_is_number(b) for b in value):
                raise LocalConfigError(f"{prefix}.adam_betas={value} must be two numbers in [0, 1); "
                                       "e.g. local.adam_betas=[0.9,0.95]")
            kwargs[name] = tuple(float(b) for b in value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise LocalConfigError(f"{name}={value} must be a positive integer; set {name}=<an integer >= 1>")


def _positive_float(name: str, value: Any) -> None:
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise LocalConfigError(f"{name}={value} must be a positive finite number; set {name}=<a number > 0>")
