"""The math agent under Molt's own runner loop, and the 0/1 grader behind it.

The agent file is loaded with Molt's ``load_agent_runner`` and driven by Molt's
``StepEnvRunner.execute``; a scripted policy stands in for vLLM's router client (no GPU or
vLLM here, see tests/fixtures/agents/molt_harness.py). Grading uses the real math-verify.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from molt.agents.base import load_agent_runner

from molt_flashreinforce.agents import AGENT_KINDS, agent_path
from molt_flashreinforce.agents.grading import grade, last_boxed
from molt_flashreinforce.agents.labels import ground_truth

_spec = importlib.util.spec_from_file_location(
    "molt_harness", Path(__file__).parent / "fixtures" / "agents" / "molt_harness.py"
)
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)

PROMPT = harness.chat_prompt(None, "What is 1/2 + 1/4? Put the final answer within \\boxed{}.")


@pytest.fixture(scope="module")
def tokenizer():
    return harness.byte_tokenizer()


@pytest.fixture(scope="module")
def runner():
    return load_agent_runner(agent_path("math"))


def test_agent_paths_are_molt_agent_files():
    for kind in AGENT_KINDS:
        path = Path(agent_path(kind))
        assert path.is_absolute() and path.suffix == ".py" and path.is_file()
    with pytest.raises(ValueError, match="Unknown agent kind 'chess'.*math, python_tool, alfworld"):
        agent_path("chess")


def test_correct_answer_gets_reward_one_and_only_the_response_is_trained(runner, tokenizer):
    response = "1/2 = 2/4, so the sum is 3/4.\n\\boxed{\\dfrac{3}{4}}<|im_end|>"
    trajectory, policy = harness.run_episode(runner, tokenizer, [response], {"ground_truth": "0.75"}, PROMPT)
    assert trajectory.reward == 1.0 and trajectory.scores == 1.0
    assert trajectory.extra_logs == {
        "missing_answer": 0, "grader_timeouts": 0, "grader_rejected": 0, "grader_restarts": 0, "turns": 1
    }
    assert not trajectory.truncated
    trained, masked, mask = harness.split_by_mask(trajectory, tokenizer)
    assert trained == response and masked == PROMPT
    assert len(trajectory.action_ranges) == 1
    assert policy.prompts == [PROMPT]
    # Behaviour log-probs: the sampler's on the response, zero on the prompt.
    probs = trajectory.rollout_log_probs
    assert [p for p, m in zip(probs, mask.tolist()) if m] == [harness.LOGPROB] * int(mask.sum())
    assert all(p == 0.0 for p, m in zip(probs, mask.tolist()) if not m)


def test_wrong_and_missing_answers_get_zero(runner, tokenizer):
    wrong, _ = harness.run_episode(runner, tokenizer, ["\\boxed{1/3}<|im_end|>"], {"ground_truth": "3/4"}, PROMPT)
    assert wrong.reward == 0.0 and wrong.extra_logs["missing_answer"] == 0
    missing, _ = harness.run_episode(runner, tokenizer, ["It is 3/4.<|im_end|>"], {"ground_truth": "3/4"}, PROMPT)
    assert missing.reward == 0.0 and missing.extra_logs["missing_answer"] == 1


def test_response_cut_at_max_tokens_is_truncated_and_ungraded(runner, tokenizer):
    response = "Let me think for a long time before answering. \\boxed{3/4}"
    trajectory, _ = harness.run_episode(
        runner, tokenizer, [response], {"ground_truth": "3/4"}, PROMPT, max_tokens=20
    )
    assert trajectory.truncated
    assert trajectory.reward == 0.0 and trajectory.extra_logs["missing_answer"] == 1
    trained, _, _ = harness.split_by_mask(trajectory, tokenizer)
    assert trained == response[:20]


@pytest.mark.parametrize(
    "answer, truth",
    [
        ("\\frac{1}{2}", "0.5"),
        ("\\dfrac{3}{4}", "3/4"),
        ("2\\sqrt{2}", "\\sqrt{8}"),
        ("x=5", "5"),
        ("10^{3}", "1000"),
        ("\\frac{\\pi}{2}", "\\pi/2"),
        ("\\{1,2\\}", "\\{2,1\\}"),
        ("x^2+2x+1", "(x+1)^2"),
        ("12^\\circ", "12"),
        ("2.0", "2"),
        ("\\text{(A)}", "A"),
    ],
)
def test_equivalent_answers_are_correct(answer, truth):
    verdict = grade(f"work...\n\\boxed{{{answer}}}", truth)
    assert verdict.correct and verdict.answer == answer


@pytest.mark.parametrize(
    "answer, truth", [("1/3", "0.33"), ("3", "4"), ("[0,1)", "[0,1]"), ("x+1", "x-1"), ("\\sqrt{2}", "2")]
)
def test_different_answers_are_wrong(answer, truth):
    assert not grade(f"\\boxed{{{answer}}}", truth).correct


def test_only_the_last_boxed_answer_counts():
    assert last_boxed("first \\boxed{5}, then \\boxed{\\frac{1}{2}} final") == "\\frac{1}{2}"
    assert last_boxed("nested \\boxed{\\frac{a}{b^{2}}}") == "\\frac{a}{b^{2}}"
    assert last_boxed("bare \\boxed 7.") == "7"
    # A box cut off mid-answer does not count; an earlier complete one does.
    assert last_boxed("\\boxed{4} and then \\boxed{\\frac{1}{") == "4"
    assert last_boxed("no box here") is None
    assert grade("\\boxed{5} no wait \\boxed{6}", "6").correct
    assert not grade("\\boxed{5} no wait \\boxed{6}", "5").correct


def test_grader_overrun_is_killed_and_graded_wrong_then_the_grader_recovers():
    # Symbolic expansion takes far longer than a millisecond: the grader process is killed.
    slow = grade("\\boxed{(x+1)^{12}}", "x^{12}+12x^{11}+66x^{10}+220x^9+495x^8+792x^7+924x^6+792x^5+495x^4+220x^3+66x^2+12x+1", timeout_s=0.001)
    assert slow.timed_out and not slow.correct
    assert slow.info()["grader_timeouts"] == 1
    assert grade("\\boxed{\\frac{1}{2}}", "0.5").correct


def test_labels_accept_molt_reward_model_dicts_and_plain_answers():
    assert ground_truth({"ground_truth": "3/4", "style": "rule"}) == "3/4"
    assert ground_truth("42") == "42" and ground_truth(["42"]) == "42" and ground_truth(7) == "7"
    with pytest.raises(ValueError, match="no 'ground_truth'.*--data.label_key reward_model"):
        ground_truth({"answer": "3"})
    with pytest.raises(ValueError, match="Unusable ground truth"):
        ground_truth("")
