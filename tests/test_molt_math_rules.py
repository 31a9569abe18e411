"""Molt's example math grader's rules (``agents/molt_math_rules.py``, ``agent.grader=molt``), rule by rule.

Each expected value is derived by hand from the rules in the module's docstring (the reason
says which rule decides). ``MOLT_MATH_GRADER=<labs-molt examples/python/utils/math_grader.py>``
also checks every row against Molt's own file. The rest: the rules run in the grader processes
under the same bound (``grading``), are chosen by ``MATH_GRADER``, and the launcher passes
``agent.grader`` to the agents.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from molt_flashreinforce.agents import grading
from molt_flashreinforce.agents.grader_pool import RULES, GraderPool, Verdict
from molt_flashreinforce.agents.molt_math_rules import equivalent, extract_answer, same_string

# (response, extracted answer, why)
EXTRACTION = [
    ("work... \\boxed{12}. So the answer is 13", "12", "a \\boxed{} comes before an answer phrase"),
    ("\\fbox{7} and then \\boxed{8}", "8", "\\boxed is looked for before \\fbox, wherever each is"),
    ("\\boxed{} but \\fbox{7}", "7", "an empty box counts as none: \\fbox next"),
    ("\\boxed{3} ... \\boxed{4", "3", "the last box that closes"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", "balanced braces inside the box"),
    ("\\boxed {x^{2}}", "x^{2}", "space before the brace"),
    ("The answer is 42.", "42.", "an answer phrase, to the end of the line"),
    ("Thus x = 5 <|im_end|>", "x = 5", "a phrase stops at '<'"),
    ("Therefore: 1/3\nand more text", "1/3", "':' after the keyword is skipped; the line ends it"),
    ("the answer is 3\nthus 4 | junk", "4", "the last phrase; '|' ends it"),
    ("The final answer is: 42 apples", ": 42 apples", "only one of is / : / = is skipped"),
    ("I found 3, then 4.5 and 7 %", "7 %", "no box or phrase: the last number, with its percent sign"),
    ("we get \\frac{3}{4} in the end", "\\frac{3}{4}", "a \\frac{a}{b} counts as a number"),
    ("no digits here", None, "nothing to extract"),
    ("", None, "empty response"),
]

# (answer, ground truth, equivalent, why)
EQUIVALENCE = [
    ("\\dfrac{1}{2}", "0.5", True, "tier 1: dfrac is frac, 0.5 is \\frac{1}{2}"),
    ("3/4", "\\frac{3}{4}", True, "tier 1: an integer a/b is \\frac{a}{b}"),
    ("\\frac12", "\\frac{1}{2}", True, "tier 1: \\frac12 gets its braces"),
    ("\\sqrt3", "\\sqrt{3}", True, "tier 1: \\sqrt3 gets its braces"),
    ("k = 3", "3", True, "tier 1: a short assignment keeps its value"),
    ("long = 3", "3", False, "tier 1: the left side is too long to be dropped; tier 2 sees letters"),
    ("5\\text{ cm}", "5", True, "tier 1: a unit after \\text{ is dropped"),
    ("50\\%", "50", True, "tier 1: percent signs are dropped"),
    (".5", "0.5", True, "tier 1: a leading '.' gets its zero"),
    ("42.", "42", True, "tier 2: a float with an integer value is that integer"),
    ("10 cm", "10", True, "tier 2: unit words are dropped"),
    ("5 hours", "5", True, "tier 2: unit words with their plural"),
    ("3 million", "3000000", False, "tier 2: million is *10^6, which is not an integer's text"),
    ("1,234", "1234", True, "tier 2: a thousands separator"),
    ("7 3/4", "31/4", True, "tier 2: a mixed number is a sum; sympy"),
    ("\\frac34", "0.75", True, "tier 2: LaTeX to text (3/4), then sympy"),
    ("2\\sqrt{2}", "\\sqrt{8}", True, "tier 2: sqrt in sympy"),
    ("2/4", "1/2", False, "tier 2: two fractions must be written the same"),
    ("\\frac{24}{2}", "12", False, "tier 2: an integer ground truth needs an integer"),
    ("12.5", "12", False, "tier 2: an integer ground truth needs an integer"),
    ("a+b", "b+a", True, "tier 2: sympy, two letters"),
    ("a+b+c", "c+b+a", False, "tier 2: three letters are never evaluated"),
    ("x^(2)", "x^2", False, "tier 2: '^(' is never evaluated"),
    ("(1, 2)", "(1,2)", True, "tier 1: spaces go"),
    ("[1,2]", "(1,2)", False, "tier 2: brackets must match"),
    ("(2,1)", "(1,2)", False, "tier 2: elements in order"),
    ("(1,2,3)", "(1,2)", False, "tier 2: element counts must match"),
    ("\\text{(B)}", "B", True, "tier 2: a bracketed single element"),
    ("\\frac{1}{2} \\foo", "0.5", True, "tier 2: pylatexenc drops the unknown command"),
    ("", "1", False, "nothing given"),
]


@pytest.mark.parametrize("response, answer, why", EXTRACTION, ids=[row[2] for row in EXTRACTION])
def test_extraction(response, answer, why):
    assert extract_answer(response) == answer, why


@pytest.mark.parametrize("answer, truth, verdict, why", EQUIVALENCE, ids=[row[3] for row in EQUIVALENCE])
def test_equivalence(answer, truth, verdict, why):
    assert equivalent(answer, truth) is verdict, why
    if why.startswith("tier 1") and verdict:
        assert same_string(answer, truth)


@pytest.mark.skipif(not os.environ.get("MOLT_MATH_GRADER"), reason="MOLT_MATH_GRADER (Molt's math_grader.py) not set")
def test_every_row_is_what_molts_own_grader_says():
    spec = importlib.util.spec_from_file_location("molt_math_grader", os.environ["MOLT_MATH_GRADER"])
    molt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(molt)
    assert [molt.extract_answer(r) for r, _, _ in EXTRACTION] == [a for _, a, _ in EXTRACTION]
    assert [molt.grade_answer(a, t) for a, t, _, _ in EQUIVALENCE] == [v for _, _, v, _ in EQUIVALENCE]


def test_a_pool_runs_the_rules_it_was_made_with():
    # \frac{24}{2} = 12 for math-verify; Molt's rules need an integer's text for an integer truth.
    verdicts = {}
    for rules in RULES:
        pool = GraderPool(1, 1 << 30, rules)
        try:
            verdicts[rules] = pool.submit("\\frac{24}{2}", "12", time.monotonic() + 30.0, 15.0).result(timeout=40.0)
        finally:
            pool.close()
    assert verdicts == {"strict": Verdict.CORRECT, "molt": Verdict.WRONG}
    with pytest.raises(ValueError, match="grader rules 'lenient': choose one of strict, molt"):
        GraderPool(1, 1 << 30, "lenient")


def test_grade_under_molt_rules_reads_answers_the_strict_grader_does_not(monkeypatch):
    pool = GraderPool(1, grading.POOL.memory_bytes, "molt")
    monkeypatch.setattr(grading, "GRADER", "molt")
    monkeypatch.setattr(grading, "POOL", pool)
    try:
        phrase = grading.grade("Adding them up, the answer is 42.", "42", 10.0)
        assert phrase.correct and phrase.answer == "42." and not phrase.timed_out
        last_number = grading.grade("so 2 + 2 = 4", "4", 10.0)
        assert last_number.correct and last_number.answer == "4"
        sympy = grading.grade("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 10.0)  # through the grader process
        assert sympy.correct and sympy.answer == "2\\sqrt{2}"
        assert not grading.grade("nothing", "4", 10.0).correct
        assert grading.grade("nothing", "4", 10.0).missing_answer
    finally:
        pool.close()
    monkeypatch.undo()
    strict = grading.grade("Adding them up, the answer is 42.", "42", 10.0)
    assert not strict.correct and strict.missing_answer


def test_math_grader_variable_picks_the_rules_and_refuses_others():
    code = "from molt_flashreinforce.agents import grading; print(grading.GRADER, grading.POOL.rules)"
    env = {**os.environ, "MATH_GRADER": "molt"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["molt", "molt"], done.stderr
    env["MATH_GRADER"] = "lenient"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "MATH_GRADER='lenient' is not usable: choose one of strict, molt (agent.grader)." in done.stderr


def test_the_launcher_passes_agent_grader_and_refuses_what_no_agent_reads():
    from hydra import compose, initialize_config_module

    from molt_flashreinforce.eval_record import GRADERS
    from molt_flashreinforce.launch.checks import MATH_GRADERS, check_grader
    from molt_flashreinforce.launch.errors import LaunchError
    from molt_flashreinforce.launch.render import agent_environment

    assert MATH_GRADERS == tuple(RULES) == grading.GRADERS and set(MATH_GRADERS) < set(GRADERS)
    with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
        math = compose(config_name="config", overrides=["experiment=math_qwen2p5_1p5b"])
        molt = compose(config_name="config", overrides=["experiment=python_tool_qwen2p5_7b", "agent.grader=molt"])
        alfworld = compose(config_name="config", overrides=["experiment=alfworld_qwen2p5_7b", "agent.grader=molt"])
    assert agent_environment(math) == {"MAX_AGENT_TURNS": "1", "MATH_GRADER": "strict"}
    assert agent_environment(molt) == {"MAX_AGENT_TURNS": "10", "MATH_GRADER": "molt"}
    check_grader(molt)
    with pytest.raises(LaunchError, match="agent.grader=molt: the alfworld agent has no answers to grade"):
        check_grader(alfworld)
    with pytest.raises(LaunchError, match="agent.grader=lenient is not one of strict, molt"):
        check_grader(OmegaConf.merge(math, {"agent": {"grader": "lenient"}}))
