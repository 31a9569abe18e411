"""One source for the algorithms' settings (molt_flashreinforce/algo_settings.py): the config
files, the objective's config and Molt's `--flashreinforce.*` flags are what it generates, and its
checks name the key, the value and the fix in the objective's terms and the launcher's."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
from pathlib import Path

import pytest

from molt_flashreinforce import algo_settings
from molt_flashreinforce.algo_settings import FLASHREINFORCE, SETTINGS, SettingError, check, flag_settings, loss_settings
from molt_flashreinforce.objective import FlashReinforceConfig

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("algo_conf", REPO / "scripts" / "algo_conf.py")
algo_conf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(algo_conf)


@pytest.mark.parametrize("algorithm", algo_settings.ALGORITHMS)
def test_the_algo_configs_are_generated_from_the_settings(algorithm):
    assert (algo_conf.CONF / f"{algorithm}.yaml").read_text(encoding="utf-8") == algo_conf.render(algorithm), (
        "conf/algo is stale: python scripts/algo_conf.py")


def test_the_objectives_config_has_one_field_per_loss_setting_with_its_default():
    fields = {field.name: field.default for field in dataclasses.fields(FlashReinforceConfig)}
    assert fields == {setting.name: setting.default for setting in loss_settings()}


def test_molts_parser_gets_one_flag_per_flag_setting():
    from molt_flashreinforce.launch.molt_cli import build_parser, flag_dests

    actions = {dest: action for dest, action in flag_dests(build_parser()).items() if dest.startswith("flashreinforce.")}
    # Besides the algo settings, only the kept exports' flags (rendered from the `exports` node).
    exports = {"flashreinforce.export_steps", "flashreinforce.export_every", "flashreinforce.export_dir"}
    assert sorted(set(actions) - exports) == sorted(f"flashreinforce.{setting.name}" for setting in flag_settings())
    assert exports <= set(actions)
    for setting in flag_settings():
        action = actions[f"flashreinforce.{setting.name}"]
        assert (action.default, action.help) == (setting.default, setting.help)
        assert tuple(action.choices or ()) == (setting.choices or ())


@pytest.mark.parametrize("values, prefix, message", [
    ({"delta": -1.0}, "algo.", "algo.delta=-1.0 must be >= 0 (a trust-region bound on a KL); use algo.delta=inf"),
    ({"delta": math.nan}, "", "delta=nan must be >= 0"),
    ({"delta": "abc"}, "algo.", "algo.delta=abc is not a number; use a bound >= 0 such as algo.delta=3e-3"),
    ({"gate_level": "tokn"}, "algo.", "algo.gate_level=tokn is not one of sequence, token; did you mean algo.gate_level=token?"),
    ({"gate_level": "token", "gate_mean": "geometric"}, "", "gate_mean=geometric needs gate_level=sequence"),
    ({"reduction": "constant_length"}, "algo.", "algo.constant_length=None must be an integer >= 1: "
                                                "algo.reduction=constant_length needs algo.constant_length > 0"),
    ({"constant_length": 6144}, "", "constant_length=6144 is only used by reduction=constant_length"),
    ({"group_size": 4}, "algo.", "algo.group_size=4: FlashREINFORCE uses one rollout per prompt; set algo.group_size=1"),
    ({"entropy_filter_q": 1.5}, "algo.", "algo.entropy_filter_q=1.5 must lie in [0, 1] (1 = filter off)"),
    ({"max_policy_lag": 2.5}, "algo.", "algo.max_policy_lag=2.5 must be an integer >= 0"),
    ({"importance_sampling": "maybe"}, "algo.", "algo.importance_sampling=maybe must be true or false"),
])
def test_a_bad_value_is_one_line_naming_the_key_the_value_and_the_fix(values, prefix, message):
    algo = {"name": FLASHREINFORCE, **{s.name: s.default for s in SETTINGS[FLASHREINFORCE]}, **values}
    with pytest.raises(SettingError) as refused:
        check(algo, prefix)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


@pytest.mark.parametrize("bounds, value, message", [
    ({"low": 0.0, "high": 1.0}, 2, "algo.knob=2 must be in [0, 1]; use a number such as algo.knob=0.25"),
    ({"low": 0.0, "high": 1.0, "open_range": True}, 1.0, "algo.knob=1.0 must be in (0, 1); use a number such as algo.knob=0.25"),
    ({"low": 0.0}, -1.0, "algo.knob=-1.0 must be >= 0; use a number such as algo.knob=0.25"),
    ({"high": 1.0}, "x", "algo.knob=x is not a number; use a number such as algo.knob=0.25"),
    ({}, math.nan, "algo.knob=nan must be a number, not nan; use a number such as algo.knob=0.25"),
])
def test_a_new_number_knob_without_its_own_refusal_still_names_the_range_and_a_fix(bounds, value, message):
    """Adding a knob is adding a Setting: one that brings no refusal text still gets a whole line."""
    knob = algo_settings.Setting("knob", float, 0.25, help="a new knob", **bounds)
    with pytest.raises(SettingError, match=f"^{re.escape(message)}$"):
        algo_settings.check_value(knob, value, "algo.")


def test_the_defaults_pass_and_come_back_normalised():
    for algorithm, settings in SETTINGS.items():
        algo = {"name": algorithm, **{s.name: s.default for s in settings}}
        assert check(algo) == {s.name: s.default for s in settings}
    with pytest.raises(SettingError, match=r"algo.clip_eps=1 must lie in \(0, 1\)"):
        check({"name": "grpo", "group_size": 8, "clip_eps": 1, "reduction": "token_mean"})
