"""The tiny comparison's statistics (experiments/tiny/summarize.py) on hand-built curves: the
first crossing, claim 1's rollouts-to-target and half-budget accuracy, and the paired bootstrap."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[1] / "experiments" / "tiny" / "summarize.py"
_spec = importlib.util.spec_from_file_location("tiny_summarize", _PATH)
summarize = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(summarize)


def test_first_crossing_interpolates_and_says_never():
    xs, ys = np.array([0.0, 100.0, 200.0]), np.array([0.1, 0.3, 0.5])
    assert summarize.first_crossing(xs, ys, 0.4) == pytest.approx(150.0)
    assert summarize.first_crossing(xs, ys, 0.05) == 0.0
    assert summarize.first_crossing(xs, ys, 0.6) == math.inf


def _run(seed, ys):
    return {"seed": seed, "curve": [(100.0 * i, y) for i, y in enumerate(ys)]}


def test_half_the_rollouts_on_curves_with_known_answers():
    # GRPO reaches 0.4 at 400 rollouts in every seed; FlashREINFORCE climbs twice as fast.
    grpo = [_run(s, [0.0, 0.1, 0.2, 0.3, 0.4]) for s in range(4)]
    flash = [_run(s, [0.0, 0.2, 0.4, 0.5, 0.6]) for s in range(4)]
    out = summarize.half_the_rollouts(flash, grpo)
    assert out["grpo_budget"] == 400 and out["half_budget"] == 200
    assert out["flashreinforce_rollouts_to_grpo_final"]["value"] == pytest.approx(200.0)
    assert out["grpo_rollouts_to_grpo_final"]["value"] == pytest.approx(400.0)
    assert out["flashreinforce_at_half_budget"]["value"] == pytest.approx(0.4)
    assert out["flashreinforce_at_half_minus_grpo_final"]["value"] == pytest.approx(0.0)
    assert out["flashreinforce_final_minus_grpo_final"]["value"] == pytest.approx(0.2)
    # Identical seeds: every resample gives the same numbers, so the intervals collapse.
    assert out["flashreinforce_rollouts_to_grpo_final"]["ci95"] == pytest.approx([200.0, 200.0])
    assert out["seeds_flash_at_half_ge_grpo_final"] == 4


def test_pairing_uses_only_shared_seeds_and_unreached_targets_are_open_ended():
    grpo = [_run(s, [0.0, 0.2, 0.4]) for s in (0, 1, 2)]
    flash = [_run(0, [0.0, 0.1, 0.2]), _run(1, [0.0, 0.1, 0.2]), _run(7, [0.0, 0.9, 0.9])]
    out = summarize.half_the_rollouts(flash, grpo)
    assert out["seeds"] == [0, 1]
    assert out["flashreinforce_rollouts_to_grpo_final"]["value"] == math.inf
    assert out["flashreinforce_rollouts_to_grpo_final"]["ci95"][1] == math.inf


def test_mean_ci_brackets_the_mean_and_shrinks_with_agreement():
    spread = summarize.mean_ci([0.1, 0.5, 0.3, 0.7, 0.2])
    assert spread["mean"] == pytest.approx(0.36)
    low, high = spread["ci95"]
    assert 0.1 <= low < 0.36 < high <= 0.7
    assert summarize.mean_ci([0.3] * 5)["ci95"] == pytest.approx([0.3, 0.3])
    difference = summarize.paired_difference([_run(s, [0.0, 0.5 + s / 10]) for s in range(3)],
                                             [_run(s, [0.0, 0.4 + s / 10]) for s in range(3)])
    assert difference["mean"] == pytest.approx(0.1) and difference["ci95"] == pytest.approx([0.1, 0.1])
