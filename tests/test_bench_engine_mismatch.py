"""The engine-mismatch benchmark's statistics (benchmarks/bench_engine_mismatch.py) against
hand-derived values, and its reading of Molt's own gate on the same numbers. No vLLM needed.

Two sequences, engine (the behaviour policy) against trainer log-probs:
  row 0: p = (0.5, 0.5) against q = (0.5, 0.25): token KLs 0 and 0.5 ln 2 + 0.5 ln(2/3) = 0.5 ln(4/3)
  row 1: p = 0.6 against q = 0.9: 0.6 ln(2/3) + 0.4 ln 4
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from molt_flashreinforce.objective import FlashReinforceConfig

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_engine_mismatch",
                                               REPO / "benchmarks" / "bench_engine_mismatch.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

ENGINE = [torch.tensor([math.log(0.5), math.log(0.5)]), torch.tensor([math.log(0.6)])]
TRAINER = [torch.tensor([math.log(0.5), math.log(0.25)]), torch.tensor([math.log(0.9)])]
ROW0_KL = 0.5 * math.log(4 / 3) / 2  # the row's mean over its two tokens
ROW1_KL = 0.6 * math.log(2 / 3) + 0.4 * math.log(4)


def test_statistics_match_the_hand_derived_values():
    gates = {"loose": FlashReinforceConfig(delta=0.5), "middle": FlashReinforceConfig(delta=0.1),
             "tight": FlashReinforceConfig(delta=0.05), "token": FlashReinforceConfig(delta=0.1, gate_level="token"),
             "geometric": FlashReinforceConfig(delta=0.1, gate_mean="geometric"),
             "filtered": FlashReinforceConfig(delta=0.1, entropy_filter_q=0.9)}
    stats = bench.mismatch_statistics(ENGINE, TRAINER, gates)
    assert stats["sequences"] == 2 and stats["tokens"] == 3
    assert stats["sampled_token_probability_mean"] == pytest.approx((0.5 + 0.5 + 0.6) / 3, rel=1e-6)
    differences = [0.0, math.log(2), math.log(0.6 / 0.9)]
    assert stats["abs_log_prob_diff"]["mean"] == pytest.approx(sum(map(abs, differences)) / 3, rel=1e-6)
    assert stats["abs_log_prob_diff"]["max"] == pytest.approx(math.log(2), rel=1e-6)
    assert stats["vllm_kl"] == pytest.approx(sum(differences) / 3, rel=1e-5)  # signed: engine minus trainer
    assert stats["sequence_bernoulli_kl"]["mean"] == pytest.approx((ROW0_KL + ROW1_KL) / 2, rel=1e-5)
    assert stats["sequence_bernoulli_kl"]["max"] == pytest.approx(ROW1_KL, rel=1e-5)
    accepted = {name: gate["acceptance_rate"] for name, gate in stats["gates"].items()}
    # 0.072 and 0.311 against δ; the token gate admits 1 of the 3 tokens (KLs 0, 0.144, 0.311);
    # the geometric mean of row 0 is 0 (its first token's KL is exactly 0); the entropy filter
    # does not change the gate.
    assert accepted == pytest.approx({"loose": 1.0, "middle": 0.5, "tight": 0.0, "token": 1 / 3,
                                      "geometric": 0.5, "filtered": 0.5})
    assert stats["gates"]["token"] == {"delta": 0.1, "gate_level": "token", "gate_mean": "arithmetic",
                                       "acceptance_rate": pytest.approx(1 / 3)}


def test_molts_own_gate_and_vllm_kl_read_the_same_numbers():
    for delta, admitted in ((0.5, 1.0), (0.1, 0.5), (0.05, 0.0)):
        molt = bench.molt_check(ENGINE, TRAINER, delta)
        assert molt["acceptance_rate"] == pytest.approx(admitted)
        assert molt["vllm_kl"] == pytest.approx((math.log(2) + math.log(0.6 / 0.9)) / 3, rel=1e-5)
        # Molt's k3 on d = trainer - engine: exp(d) - 1 - d per token, token mean.
        k3 = sum(math.exp(-d) - 1 + d for d in (0.0, math.log(2), math.log(0.6 / 0.9))) / 3
        assert molt["k3_kl"] == pytest.approx(k3, rel=1e-5)


def test_sequences_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="same lengths"):
        bench.mismatch_statistics(ENGINE, [TRAINER[0], torch.tensor([-0.1, -0.2])], {})


def test_padding_masks_exactly_the_missing_tokens():
    values, mask = bench.padded([torch.tensor([-1.0, -2.0]), torch.tensor([-3.0])])
    assert values.tolist() == [[-1.0, -2.0], [-3.0, 0.0]]
    assert mask.tolist() == [[True, True], [True, False]]
