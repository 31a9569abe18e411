"""Strict math-verify equivalence of a final answer and a ground truth (no timeouts of its own).

Contract: ``equivalent(answer, ground_truth) -> bool``; call it under a wall-clock bound (the
grader processes of ``grader_pool``), since math-verify's own timeouts use ``signal.alarm``.

**Strict:** an answer is equivalent to something only if math-verify's LaTeX parser read all
of it. math-verify's ``parse`` is built to find *an* answer in free text, so on its own it is
lenient in three ways, each of which graded a wrong answer correct:

1. it tries every expression it finds, so from ``1+\\text{anything}`` (or ``2+\\foo``,
   ``1+__import__('os')``) it keeps the number ``1`` once the whole fails to parse;
2. when a chain ``a = b = c`` fails to parse it parses only the last part, so
   ``\\foo = x = 3`` was read as ``3``;
3. it reads the last ``\\boxed{}`` inside the text, so ``\\boxed{3} + \\text{junk}`` was ``3``.

Here the answer goes through math-verify's own boxed path, ``parse("\\boxed{answer}")`` with
one LaTeX extraction config and ``extraction_mode="first_match"``: the whole answer is the only
candidate, and when it does not parse nothing else is tried. The LaTeX grammar's top rule ends
in end-of-input and its error listener raises on any token it cannot place, so a successful
parse of that candidate consumed every token of its (normalized) text. The chain fallback is
closed by re-parsing a chained answer with ``latex2sympy`` directly, which has no fallback; a
box inside the answer is not one answer and is refused.

What math-verify's normalization drops before parsing is presentation, not content, and stays
dropped: spacing, ``\\left``/``\\right``, ``\\displaystyle``, dollar signs, degrees, a trailing
unit in ``\\text{}`` after a complete quantity (``5\\text{ cm}`` = 5, but ``1+\\text{ cm}``
leaves ``1+``, which does not parse). A trailing percent sign is dropped too, as Molt's own
math grader does (``50\\%`` = 50). Everything else math-verify equates stays equal:
``\\frac{1}{2}`` = 0.5, ``x=1`` for 1, ``2\\sqrt{2}`` = ``\\sqrt{8}``, intervals, sets and
tuples where the ground truth's type allows. The ground truth is trusted and parsed as before
(LaTeX or a plain expression).
"""

from __future__ import annotations

import re
from dataclasses import replace

from latex2sympy2_extended import latex2sympy, normalize_latex
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.parser import get_last_eq

_ANSWER_CONFIG = LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)
_GROUND_TRUTH_CONFIGS = [LatexExtractionConfig(), ExprExtractionConfig()]
_TRAILING_PERCENT = re.compile(r"\s*\\?%\s*$")
_BOX = re.compile(r"\\(?:boxed|fbox)")


def parse_answer(answer: str) -> list:
    """math-verify's ``[expression, normalized text]`` for the whole answer, or [] if it does not parse."""
    if _BOX.search(answer):
        return []
    answer = _TRAILING_PERCENT.sub("", answer)
    boxed = "\\boxed{" + answer + "}"
    parsed = parse(boxed, [_ANSWER_CONFIG], fallback_mode="first_match", extraction_mode="first_match",
                   parsing_timeout=None)  # fmt: skip
    if len(parsed) != 2:
        return []
    text = parsed[1]
    # parse() read exactly this candidate: its normalization of the whole box.
    if text != normalize_latex(boxed, replace(_ANSWER_CONFIG.normalization_config, boxed="last")):
        return []
    if get_last_eq(text) != text:
        try:
            latex2sympy(text, normalization_config=None)
        except Exception:  # noqa: BLE001 - only its last link parsed: not the whole answer
            return []
    return parsed


def equivalent(answer: str, ground_truth: str) -> bool:
    predicted = parse_answer(answer)
    if not predicted:
        return False
    gold = parse(f"${ground_truth}$", _GROUND_TRUTH_CONFIGS, parsing_timeout=None)
    return bool(gold) and bool(verify(gold, predicted, timeout_seconds=None))
