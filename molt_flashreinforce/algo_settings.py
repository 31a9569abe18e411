"""The algorithms' settings, declared once: every knob of the Hydra `algo` node with its type,
choices or range, default, help text and source.

    SETTINGS[algorithm]       the `Setting`s of `flashreinforce` or `grpo`, in the config's order
    check(algo, prefix)       raise `SettingError` (one line naming the key, the value and the fix)
    loss_settings()           the FlashREINFORCE knobs of the objective (`objective.FlashReinforceConfig`)
    flag_settings()           the knobs rendered as Molt flags `--flashreinforce.<name>`

Everything else is generated from these: the objective's config, the `--flashreinforce.*` flags of
Molt's parser (plugin/cli_flags.py), the rendered command (launch/render.py), the launcher's
validation (launch/validate.py), `conf/algo/*.yaml` and the docs' settings table
(scripts/algo_settings.py). Adding a knob is adding a `Setting` here (and using it). Nothing here
imports torch, so a refusal takes well under a second.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Mapping

FLASHREINFORCE, GRPO = "flashreinforce", "grpo"
ALGORITHMS = (FLASHREINFORCE, GRPO)


class SettingError(ValueError):
    """A bad `algo` value; the message is one line naming the key, the value and the fix."""


@dataclass(frozen=True)
class Setting:
    name: str
    type: type  # bool, int, float or str
    default: Any
    help: str  # also the comment above the key in conf/algo/<algorithm>.yaml
    source: str = ""  # source tags (docs/sources.md), the key's inline comment; "" for none
    choices: tuple[str, ...] | None = None
    optional: bool = False  # None (YAML null) is allowed and means "off"
    low: float | None = None  # inclusive bounds; `open_range` makes both exclusive
    high: float | None = None
    open_range: bool = False
    exactly: Any = None  # the one allowed value
    refusal: str = ""  # why a value is refused, after "{key}={value} "; {key} is the full key
    fix: str = ""  # how to write it, after "is not a number; " (numbers)
    loss: bool = False  # a knob of the objective (`objective.FlashReinforceConfig`)
    flag: bool = False  # rendered as --flashreinforce.<name> (plugin/cli_flags.py)

    def yaml_value(self, value: Any = None) -> str:
        value = self.default if value is None else value
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "true" if value else "false"
        return repr(value) if isinstance(value, float) else str(value)


_GROUP_SIZE_PAPER = "[R],[J:common],[M]"
_MAX_POLICY_LAG = Setting(
    "max_policy_lag", int, None, optional=True, low=0, flag=True,
    help="No trajectory more than this many optimizer updates old reaches the loss: generation is held back "
         "and the rare straggler is dropped and counted (plugin/lag_bound.py). null = unbounded, the lag then "
         "emerges from the queue and in-flight settings. Each experiment sets the paper's lag.",
    refusal="must be an integer >= 0; use a number of optimizer updates such as {key}=8, or {key}=null for no bound")

SETTINGS: dict[str, tuple[Setting, ...]] = {
    FLASHREINFORCE: (
        Setting("group_size", int, 1, source=_GROUP_SIZE_PAPER, exactly=1,
                help=f"One rollout per prompt is the method {_GROUP_SIZE_PAPER}; > 1 is rejected.",
                refusal=": FlashREINFORCE uses one rollout per prompt; set {key}=1 (compare against several "
                        "samples per prompt with algo=grpo)"),
        Setting("delta", float, 3e-3, source="[L] (each experiment sets its own)", low=0.0, loss=True, flag=True,
                help="Trust-region threshold on the per-trajectory mean Bernoulli KL. `inf` = no trust region (the "
                     "paper's \"IS only\" ablation). Experiments set their own value; 3e-3 is the reference loss's "
                     "default [L].",
                refusal="must be >= 0 (a trust-region bound on a KL); use {key}=inf to disable the trust region",
                fix="use a bound >= 0 such as {key}=3e-3, or {key}=inf to disable the trust region"),
        Setting("gate_level", str, "sequence", source="[R],[T],[L]", choices=("sequence", "token"), loss=True,
                flag=True, help="sequence: drop the whole trajectory (paper); token: drop single tokens (the Table 7 "
                                "ablation [P3])."),
        Setting("gate_mean", str, "arithmetic", source="[R],[L],[T]", choices=("arithmetic", "geometric"), loss=True,
                flag=True, help="arithmetic (paper default) | geometric (the Table 16 ablation [P3]) mean of the "
                                "per-token proxy."),
        Setting("reduction", str, "sample_mean", source="[R],[J:common],[M]",
                choices=("sample_mean", "token_mean", "constant_length"), loss=True, flag=True,
                help="sample_mean: 1/T_i within a trajectory, then 1/B (paper); token_mean: 1/sum_i T_i; "
                     "constant_length: 1/(B * constant_length) (the Table 6b ablations [P3])."),
        Setting("constant_length", int, None, optional=True, low=1, loss=True, flag=True,
                help="Required by reduction=constant_length (tokens); the paper's tool variant uses 6144.",
                refusal="must be an integer >= 1: {prefix}reduction=constant_length needs {key} > 0 (the paper's tool "
                        "variant uses 6144)"),
        Setting("importance_sampling", bool, True, source="[R],[T],[L]", loss=True, flag=True,
                help="false = the no-IS ablation: ratio 1 and, as in the paper, no gate either."),
        Setting("entropy_filter_q", float, 1.0, source="[E],[J:common]", low=0.0, high=1.0, loss=True, flag=True,
                help="Failure-token entropy filter: keep ceil(q * T_i) highest-entropy tokens of each failed "
                     "trajectory. 1.0 = off.",
                refusal="must lie in [0, 1] (1 = filter off)", fix="use a fraction in [0, 1] (1 = filter off)"),
        Setting("fused_head", bool, True, source="our choice", flag=True,
                help="Compute the sampled-token log-probs (and the filter's entropies) in chunks inside the "
                     "actor's lm_head, never holding the [S, V] logits (molt_flashreinforce/fused_head.py); the "
                     "same values as Molt's head. false = Molt's own head, which a placement with actor tp or cp "
                     "> 1 also keeps. Refused with an entropy bonus (molt.actor.entropy_coef > 0) or score "
                     "centering."),
        _MAX_POLICY_LAG,
    ),
    GRPO: (
        Setting("group_size", int, 4, source="[J:qwen7b_tool]", low=2,
                help="Samples per prompt; experiments set the paper's matched-budget value (4 tool, 8 ALFWorld).",
                refusal="must be an integer >= 2; GRPO's group baseline needs several samples per prompt, "
                        "e.g. {key}=4"),
        Setting("clip_eps", float, 0.2, source="[J:qwen7b_tool],[J:alfworld]", low=0.0, high=1.0, open_range=True,
                help="PPO clip range, low and high (actor.eps_clip_low_high 0.2 0.2 [J:qwen7b_tool],[J:alfworld]).",
                refusal="must lie in (0, 1); the paper uses {key}=0.2", fix="the paper uses {key}=0.2"),
        Setting("reduction", str, "token_mean", source="the trainer's PPO token-mean [J:qwen7b_tool],[X]",
                choices=("token_mean",), help=""),
        _MAX_POLICY_LAG,
    ),
}
HEADERS = {  # the comment that opens conf/algo/<algorithm>.yaml
    FLASHREINFORCE: "FlashREINFORCE: one rollout per prompt, A_i = R_i - mean_B(R), detached unclipped token ratio "
                    "pi/mu against the stored sampling log-probs, a sequence trust region on the mean sampled-token "
                    "Bernoulli KL, sample-mean reduction, one optimizer step per fresh batch. Every field below is "
                    "one of the paper's ablations; defaults are the paper's main method.",
    GRPO: "GRPO, the paper's baseline as the repo's tool and ALFWorld settings define it [J:qwen7b_tool], "
          "[J:alfworld],[E]: group-mean baseline divided by the group std, PPO clipped surrogate, token-mean "
          "reduction, no batch whitening, no behaviour importance correction, one pass over each batch.",
}


def loss_settings() -> tuple[Setting, ...]:
    return tuple(s for s in SETTINGS[FLASHREINFORCE] if s.loss)


def flag_settings() -> tuple[Setting, ...]:
    return tuple(s for s in SETTINGS[FLASHREINFORCE] if s.flag)


def _get(algo: Any, key: str) -> Any:
    return algo.get(key) if isinstance(algo, Mapping) or hasattr(algo, "get") else getattr(algo, key, None)


def _refuse(key: str, value: Any, why: str) -> SettingError:
    return SettingError(f"{key}={value}{'' if why.startswith(':') else ' '}{why}")


def check_value(setting: Setting, value: Any, prefix: str) -> Any:
    """The value, normalised (numbers as float or int); raises for a bad one."""
    key = f"{prefix}{setting.name}"
    refusal = setting.refusal.format(key=key, prefix=prefix)
    if value is None and setting.optional:
        return None
    if setting.type is bool:
        if not isinstance(value, bool):
            raise _refuse(key, value, "must be true or false")
        return value
    if setting.type is str:
        if value not in setting.choices:
            close = difflib.get_close_matches(str(value), setting.choices, n=3, cutoff=0.7)
            hint = f"; did you mean {' or '.join(f'{key}={c}' for c in close)}?" if close else ""
            raise _refuse(key, value, f"is not one of {', '.join(setting.choices)}{hint}")
        return value
    if setting.type is int:
        if isinstance(value, bool) or not isinstance(value, int) or (
                setting.low is not None and value < setting.low) or (setting.exactly is not None and value != setting.exactly):
            raise _refuse(key, value, refusal or f"must be an integer >= {setting.low}")
        return value
    example = f"use a number such as {key}={setting.yaml_value()}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _refuse(key, value, f"is not a number; {setting.fix.format(key=key) or example}")
    number = float(value)
    inside = not math.isnan(number) and (
        (setting.low is None or (number > setting.low if setting.open_range else number >= setting.low))
        and (setting.high is None or (number < setting.high if setting.open_range else number <= setting.high)))
    if not inside:
        raise _refuse(key, value, refusal or f"must be {_bounds(setting)}; {example}")
    return number


def _bounds(setting: Setting) -> str:
    """'in [0, 1]', 'in (0, 1)', '>= 0', '<= 1' or 'a number, not nan': what a number setting accepts."""
    if setting.low is not None and setting.high is not None:
        opening, closing = "()" if setting.open_range else "[]"
        return f"in {opening}{setting.low:g}, {setting.high:g}{closing}"
    if setting.low is not None:
        return f"{'>' if setting.open_range else '>='} {setting.low:g}"
    if setting.high is not None:
        return f"{'<' if setting.open_range else '<='} {setting.high:g}"
    return "a number, not nan"


def check(algo: Any, prefix: str = "algo.") -> dict[str, Any]:
    """The `algo` node's settings for its algorithm (`algo.name`), checked and normalised; raises
    `SettingError` for the first bad one. `prefix` is how the keys are named in the message."""
    name = _get(algo, "name")
    if name not in ALGORITHMS:
        raise _refuse(f"{prefix}name", name, f"is not one of {', '.join(ALGORITHMS)}")
    values = {s.name: check_value(s, _get(algo, s.name), prefix) for s in SETTINGS[name]}
    if name == FLASHREINFORCE:
        check_loss(values, prefix)
    return values


def check_loss(values: Mapping[str, Any], prefix: str = "") -> None:
    """The rules between FlashREINFORCE's loss knobs (each already valid on its own)."""
    if values["gate_level"] == "token" and values["gate_mean"] != "arithmetic":
        raise _refuse(f"{prefix}gate_mean", values["gate_mean"],
                      f"needs {prefix}gate_level=sequence (the token gate compares each token's KL with delta "
                      f"directly); drop {prefix}gate_mean or use {prefix}gate_level=sequence")
    constant_length = next(s for s in SETTINGS[FLASHREINFORCE] if s.name == "constant_length")
    if values["reduction"] == "constant_length":
        if values["constant_length"] is None:
            raise _refuse(f"{prefix}constant_length", None,
                          constant_length.refusal.format(key=f"{prefix}constant_length", prefix=prefix))
    elif values["constant_length"] is not None:
        raise _refuse(f"{prefix}constant_length", values["constant_length"],
                      f"is only used by {prefix}reduction=constant_length; remove it or set "
                      f"{prefix}reduction=constant_length")
