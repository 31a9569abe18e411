"""A same-weights refit of vLLM's CPU engine leaves an MoE model's log-probs exact only with
`rehearsal.vllm_cpu_fixes.repack_cpu_moe_on_refit` (docs/vllm-cpu-moe-refit.md).

It runs scripts/repro_vllm_cpu_moe_refit.py once (one engine start, about a minute): vLLM's CPU
build in its own process, a tiny Qwen3-30B-A3B-shaped model, Molt's refit sequence with the same
weights first without the fix, then twice with it. The first refit shows what the test guards
against (vLLM 0.32.0 leaves the experts' weights in the checkpoint's plain layout, unpacked for
its CPU kernel); the fixed refits must give the starting log-probs back and the packed layout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from molt_flashreinforce.evaluation.engine import vllm_version

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(vllm_version() is None, reason="vLLM's CPU build is not installed (scripts/setup_vllm.sh; the test set-up runs it)"),
]

REPRO = Path(__file__).resolve().parents[1] / "scripts" / "repro_vllm_cpu_moe_refit.py"
# fp32 engine, same weights, same prompts: a correct refit reproduces the log-probs bit for bit;
# the unpacked experts move them by about 0.1 nats.
EXACT = 1e-6
BROKEN = 1e-2


def test_same_weights_refit_keeps_moe_logprobs_only_with_the_repack(tmp_path, warm_compile_cache):
    out = tmp_path / "refit.json"
    path = os.pathsep.join(filter(None, [str(REPRO.parents[1]), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(warm_compile_cache), PYTHONPATH=path)
    done = subprocess.run([sys.executable, str(REPRO), "--with-fix", "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-1000:]  # stdout: the measurements
    report = json.loads(out.read_text())
    start, unfixed, *fixed = report["runs"]
    assert report["moe_layers_fixed"] == 2  # TINY_SHAPE's two decoder layers, each an MoE block
    assert len(start["layouts"]) == 4 and all(v["vs_packed"] == 0 for v in start["layouts"].values())

    assert unfixed["max_abs_delta"] > BROKEN, "vLLM's CPU MoE refit no longer drifts: the repack may be unneeded"
    assert all(v["vs_plain"] == 0 and v["vs_packed"] > 0 for v in unfixed["layouts"].values())

    assert len(fixed) == 2
    for run in fixed:
        assert run["max_abs_delta"] <= EXACT, run["label"]
        assert all(v["vs_packed"] == 0 for v in run["layouts"].values()), run["label"]
