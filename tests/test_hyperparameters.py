"""docs/hyperparameters.md is exactly what the configs generate, and every value has an origin."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "hyperparameters.md"
_spec = importlib.util.spec_from_file_location("hyperparameters", REPO / "scripts" / "hyperparameters.py")
hyperparameters = sys.modules["hyperparameters"] = importlib.util.module_from_spec(_spec)  # its dataclasses look it up
_spec.loader.exec_module(hyperparameters)


def test_doc_is_regenerated_from_the_configs():
    assert DOC.read_text(encoding="utf-8") == hyperparameters.render(), (
        "docs/hyperparameters.md is stale: python scripts/hyperparameters.py > docs/hyperparameters.md")


def test_every_hyperparameter_is_sourced_or_our_choice():
    for experiment in hyperparameters.EXPERIMENTS:
        for algo in hyperparameters.ALGOS:
            unsourced = [e.key for e in hyperparameters.entries(experiment, algo) if e.origin == "unsourced"]
            assert unsourced == [], f"{experiment} x {algo}: {unsourced} cite no source and are not marked our choice"


def test_entries_trace_the_deciding_file_and_its_tags():
    math = {e.key: e for e in hyperparameters.entries("math_qwen2p5_1p5b", "flashreinforce")}
    assert (math["molt.train.num_episodes"].value, math["molt.train.num_episodes"].tags,
            math["molt.train.num_episodes"].file) == ("68", ("J:qwen_math",),
                                                       "experiment_algo/math_qwen2p5_1p5b_flashreinforce.yaml")
    assert math["molt.actor.adam.lr"].file == "config.yaml" and math["molt.actor.adam.lr"].origin == "paper"
    # The native online eval's 4 is named in parentheses: only [T],[M] source the 16 used here.
    assert math["molt.eval.n_samples_per_prompt"].tags == ("T", "M")
    assert math["placement"].value == "gpu16_actor2_vllm14" and math["placement"].tags == ("E",)
    moe = {e.key: e for e in hyperparameters.entries("moe_lag8_qwen3_30b_a3b", "flashreinforce")}
    assert (moe["algo.delta"].tags, moe["algo.delta"].origin) == (("P3", "P3m"), "paper (secondary)")
    assert moe["molt.rollout.vllm_generate_batch_size"].origin == "our choice"
    grpo = {e.key: e for e in hyperparameters.entries("long_horizon_r1_distill_1p5b", "grpo")}
    # A null an experiment file sets on purpose is listed; defaults left null are not.
    assert grpo["molt.rollout.vllm_generate_batch_size"].value == "null (unset)"
    assert "algo.constant_length" not in math


def test_annotations_read_inline_and_block_comments_under_their_parents():
    text = ("molt:\n  # above a\n  # continued\n  a: 1\n  b: 2 # [R] inline\n  c:\n"
            "    d: x # our choice\n# stray\ne: 3\n")
    notes = hyperparameters._annotations(text, "")
    assert {key: note.comment for key, note in notes.items()} == {
        "molt.a": "above a continued", "molt.b": "[R] inline", "molt.c.d": "our choice", "e": "stray"}
    assert set(hyperparameters._annotations("delta: 1\n", "algo")) == {"algo.delta"}
