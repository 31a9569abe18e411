"""Cheap static screens of a model's final answer, run before any parser sees it.

Contract: ``screen(answer) -> str | None``: the name of the first screen the answer fails, or
None when it passes them all. A screen looks at characters only (no parsing, no arithmetic on
the answer's numbers beyond counting digits), so it costs microseconds whatever the answer.
The grader grades an answer that fails one as incorrect at once (``grader_rejected``).

The bounds sit far above what a final answer of the training sets needs (a number, a
fraction, a short expression, an interval or a small set) and below what measurably stalls
math-verify's parser or sympy on this package's grader (see docs/agents.md, "Grading"):

* ``length``: more than ``MAX_ANSWER_CHARS`` characters (a 20,000-term sum, a 200x200 matrix);
* ``nesting``: brackets of any kind nested deeper than ``MAX_NESTING`` (the LaTeX parser's
  time grows exponentially with brace depth: 14 levels take seconds);
* ``exponent_tower``: a power whose exponent is a literal of more than ``MAX_EXPONENT_DIGITS``
  digits, or a numeric power ``b^{c}`` above ``10**MAX_EXPONENT_DIGITS`` (``9^{9^{9}}``,
  ``10^{10^{10}}``), or carets stacked three deep (``a^{b^{c^{d}}}``); ``e^{-x^2}`` passes;
* ``factorial``: a factorial of a factorial (``10!!``, ``(3!)!``), of a group holding a power,
  or of a literal of more than ``MAX_FACTORIAL_DIGITS`` digits;
* ``matrix_size``: a matrix (or array) of more than ``MAX_MATRIX_CELLS`` cells.
"""

from __future__ import annotations

import math
import re

MAX_ANSWER_CHARS = 300
MAX_NESTING = 8
MAX_EXPONENT_DIGITS = 6
MAX_FACTORIAL_DIGITS = 5
MAX_MATRIX_CELLS = 100

_OPEN, _CLOSE = "([{", ")]}"
_NUMERIC_POWER = re.compile(r"(\d+)\s*\^\s*(?:\{\s*(\d+)\s*\}|(\d))")
_MATRIX = re.compile(r"\\begin\{(\w*matrix\*?|array)\}(.*?)\\end\{\1\}", re.DOTALL)


def screen(answer: str) -> str | None:
    if len(answer) > MAX_ANSWER_CHARS:
        return "length"
    if _nesting_depth(answer) > MAX_NESTING:
        return "nesting"
    if _has_huge_power(answer):
        return "exponent_tower"
    if _has_huge_factorial(answer):
        return "factorial"
    if _matrix_cells(answer) > MAX_MATRIX_CELLS:
        return "matrix_size"
    return None


def _nesting_depth(text: str) -> int:
    depth = deepest = 0
    for char in text:
        if char in _OPEN:
            depth += 1
            deepest = max(deepest, depth)
        elif char in _CLOSE:
            depth = max(0, depth - 1)  # half-open intervals close with the other bracket
    return deepest


def _group_end(text: str, start: int) -> int:
    """Index just past the brace group opening at ``text[start] == "{"`` (or the text's end)."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def _exponents(text: str) -> list[str]:
    """The exponent of every caret in ``text``: a brace group's content, else one token."""
    found = []
    for match in re.finditer(r"\^\s*", text):
        start = match.end()
        if start < len(text) and text[start] == "{":
            found.append(text[start + 1 : _group_end(text, start) - 1])
        else:
            token = re.match(r"\d+|\\[a-zA-Z]+|.", text[start:])
            found.append(token.group(0) if token else "")
    return found


def _tower_height(text: str) -> int:
    exponents = _exponents(text)
    return 1 + max(map(_tower_height, exponents)) if exponents else 0


def _has_huge_power(text: str) -> bool:
    for exponent in _exponents(text):
        bare = exponent.strip()
        if bare.isdigit() and len(bare.lstrip("0")) > MAX_EXPONENT_DIGITS:
            return True
        power = _NUMERIC_POWER.fullmatch(bare)
        if power:
            base, top = int(power.group(1)), int(power.group(2) or power.group(3))
            if base > 1 and top * math.log10(base) > MAX_EXPONENT_DIGITS:
                return True
    return _tower_height(text) >= 3


def _has_huge_factorial(text: str) -> bool:
    for match in re.finditer(r"(?<!\\)!", text):
        before = text[: match.start()].rstrip()
        if not before:
            continue
        if before[-1] == "!":
            return True
        if before[-1] in _CLOSE:
            operand = _group_before(before)
            if re.search(r"(?<!\\)!|\^", operand):
                return True
            continue
        digits = re.search(r"\d+$", before)
        if digits and len(digits.group(0).lstrip("0")) > MAX_FACTORIAL_DIGITS:
            return True
    return False


def _group_before(text: str) -> str:
    """The bracket group that ends ``text`` (its last character closes it)."""
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        if text[i] in _CLOSE:
            depth += 1
        elif text[i] in _OPEN:
            depth -= 1
            if depth == 0:
                return text[i:]
    return text


def _matrix_cells(text: str) -> int:
    cells = 0
    for match in _MATRIX.finditer(text):
        rows = re.split(r"\\\\", match.group(2))
        cells += len(rows) * max(row.count("&") + 1 for row in rows)
    return cells
