"""The rules of Molt's example math grader, the one behind the paper's numbers (``MATH_GRADER=molt``).

Contract: ``extract_answer(response) -> str | None`` finds the final answer;
``same_string(answer, ground_truth) -> bool`` is the rules' first, string-only tier (cheap, no
parser); ``equivalent(answer, ground_truth) -> bool`` applies both tiers. ``equivalent`` has no time
bound of its own (sympy may run long): call it in a grader process (``grader_pool``).

Written here from the documented behaviour of labs-molt's ``examples/python/utils/math_grader.py``
(release 0.1.6; the molt-rl wheel ships no examples), which the paper's Molt launcher ran through
``examples/python/agents/math.py``. It is more lenient than this package's strict grader
(``grading.py``): an answer needs no ``\\boxed{}``, and a wrong parse falls back to text.

**Extraction**, the first that finds something: the content of the last balanced ``\\boxed{...}``
(a non-empty one), else of the last ``\\fbox{...}``; else the text after the last "final answer",
"answer", "therefore" or "thus" (case-insensitive, an optional "is", ":" or "=" skipped) up to a
newline, ``<`` or ``|``; else the last number (``-1.5``, ``40 %``) or ``\\frac{a}{b}`` in the text.

**Tier 1, strings.** Both sides lose line breaks, ``\\!``, ``\\left``/``\\right``, degree marks,
``\\$``, percent signs and a unit after ``\\text{ ``; ``tfrac``/``dfrac`` become ``frac``; a leading
``.`` gets its zero; a short assignment (``k = 3``, left side at most two characters) keeps its
value; ``\\sqrt3`` and ``\\frac12`` get their braces; spaces go; ``0.5`` and an integer ``a/b`` become
``\\frac{..}{..}``. Equal strings are equivalent.

**Tier 2, sympy.** A second normalization: a whole ``\\text{..}`` unwrapped; ``$``, ``%`` and unit
words (cm, hours, ...) dropped; "or"/"and" become commas; million/billion/trillion powers of ten;
outer braces dropped; a float with an integer value becomes that integer; LaTeX turned into text
(pylatexenc; ``√`` -> ``sqrt``, ``π`` -> ``pi``, ...); ``7 3/4`` read as ``7+3/4``; spaces and braces
removed; lower case; ``1,000`` -> ``1000``. Equal strings are equivalent. Otherwise both split into
elements when bracketed (``(1,2)``, ``[a,b]``): the brackets and the element counts must match, and
each pair of elements must be: two fractions ``a/b``, equal as strings (no reduction); else both
integers or both not (an integer ground truth needs an exact integer); and then ``gt - answer``
simplifying to 0 in sympy, evaluated only when it names at most two distinct letters (``sqrt`` and
``frac`` aside) and has no ``^{``, ``^(``, stacked or multi-digit exponents. A parse error is "not
equivalent".
"""

from __future__ import annotations

import re

_ANSWER_PHRASE = re.compile(r"(?:final\s+answer|answer|therefore|thus)\s*(?:is|:|=)?\s*([^\n<|]+)", re.IGNORECASE)
_LAST_NUMBER = re.compile(r"(?:[-+]?\d+(?:\.\d+)?\s*%?)|(?:\\frac\s*{[^{}]+}\s*{[^{}]+})")
_UNIT_WORDS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month",
               "year", "foot", "feet", "inch", "yard")  # fmt: skip
_SCALE_WORDS = (("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12"))
_TEXT_SYMBOLS = (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*"))
_BRACKETS = "()[]"
_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_UNSAFE_FOR_SYMPY = re.compile(r"\^\{|\^\(|\^[0-9]+\^|\^[0-9][0-9]+")
_THOUSANDS = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_WHOLE_TEXT = re.compile(r"^\\text\{(?P<text>.+?)\}$")


# ── extraction ──


def _last_braced(text: str, command: str) -> str | None:
    """Content of the last ``command{...}`` whose braces close (an unclosed later one is skipped)."""
    for match in reversed(list(re.finditer(re.escape(command) + r"\s*{", text))):
        depth = 1
        for index in range(match.end(), len(text)):
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            if depth == 0:
                return text[match.end() : index].strip()
    return None


def extract_answer(response: str) -> str | None:
    if not response:
        return None
    for command in ("\\boxed", "\\fbox"):
        boxed = _last_braced(response, command)
        if boxed:
            return boxed
    for match in reversed(list(_ANSWER_PHRASE.finditer(response))):
        if match.group(1).strip():
            return match.group(1).strip()
    numbers = _LAST_NUMBER.findall(response)
    return numbers[-1].strip() if numbers else None


# ── tier 1: strings ──


def _braced_fracs(text: str) -> str:
    r"""``\frac12`` -> ``\frac{1}{2}``, ``\frac1{2}`` -> ``\frac{1}{2}``; a shape it cannot read is left whole."""
    head, *tails = text.split("\\frac")
    pieces = [head]
    for tail in tails:
        if tail.startswith("{"):
            pieces.append("\\frac" + tail)
        elif len(tail) < 2:
            return text
        elif tail[1] == "{":
            pieces.append("\\frac{" + tail[0] + "}" + tail[1:])
        else:
            pieces.append("\\frac{" + tail[0] + "}{" + tail[1] + "}" + tail[2:])
    return "".join(pieces)


def _braced_sqrts(text: str) -> str:
    head, *tails = text.split("\\sqrt")
    return head + "".join("\\sqrt" + (tail if not tail or tail[0] == "{" else "{" + tail[0] + "}" + tail[1:])
                          for tail in tails)  # fmt: skip


def _integer_ratio_as_frac(text: str) -> str:
    numerator, slash, denominator = text.partition("/")
    if not slash or "/" in denominator:
        return text
    try:
        a, b = int(numerator), int(denominator)
    except ValueError:
        return text
    return f"\\frac{{{a}}}{{{b}}}" if text == f"{a}/{b}" else text


def _tier1(text: str) -> str:
    text = text.strip()
    whole = _WHOLE_TEXT.search(text)
    if whole:
        text = whole.group("text").strip()
    for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"), ("\\left", ""),
                     ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("°", ""), ("\\$", "")):
        text = text.replace(old, new)
    text = text.split("\\text{ ")[0]  # a trailing unit: "5\text{ cm}"
    for old, new in (("\\%", ""), ("%", ""), (" .", " 0."), ("{.", "{0.")):
        text = text.replace(old, new)
    if not text:
        return text
    if text.startswith("."):
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        text = sides[1]
    text = _braced_fracs(_braced_sqrts(text).replace(" ", ""))
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _integer_ratio_as_frac(text)


def same_string(answer: str, ground_truth: str) -> bool:
    return _tier1(ground_truth) == _tier1(answer)


# ── tier 2: sympy ──


def _without_thousands_commas(text: str) -> str:
    while True:
        replaced = _THOUSANDS.sub(r"\1\3\4", text)
        if replaced == text:
            return text
        text = replaced


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _is_integer_text(text: str) -> bool:
    try:
        value = float(_without_thousands_commas(text))
        return abs(value - round(value)) <= 1e-7
    except (ValueError, OverflowError):
        return False


def _latex_as_text(text: str) -> str:
    from pylatexenc.latex2text import LatexNodes2Text

    text = text.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    text = LatexNodes2Text().latex_to_text(text)
    for symbol, word in _TEXT_SYMBOLS:
        text = text.replace(symbol, word)
    return text.strip()


def _tier2(text: str) -> str:
    whole = _WHOLE_TEXT.search(text)
    if whole:
        text = whole.group("text")
    text = text.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    text = text.replace(" or ", " , ").replace(" and ", " , ")
    for word, power in _SCALE_WORDS:
        text = text.replace(word, power)
    for unit in _UNIT_WORDS:
        text = re.sub(unit + r"(es)?(s)? *(\^[0-9]+)?", "", text)
    text = re.sub(r"\^ *\\circ", "", text).replace("°", "")
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    text = re.sub(r",\\! *", "", text)
    if _is_number(text) and _is_integer_text(text):
        text = str(int(round(float(text))))
    if "\\" in text:
        try:
            text = _latex_as_text(text)
        except Exception:  # noqa: BLE001 - text pylatexenc cannot read stays as it is
            pass
    text = re.sub("- *", "-", text)
    text = re.sub("([0-9]) +([0-9])", r"\1+\2", text)  # a mixed number: 7 3/4 is 7+3/4
    text = text.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _is_integer_text(text):
        text = str(int(float(text.replace(",", ""))))
    return text


def _elements(text: str) -> list[str]:
    text = _without_thousands_commas(text)
    if len(text) > 2 and text[0] in _BRACKETS and text[-1] in _BRACKETS and \
            not any(char in _BRACKETS for char in text[1:-1]):
        return [element.strip() for element in text[1:-1].split(",")]
    return [text] if text else []


def _sympy_may_evaluate(expression: str) -> bool:
    letters = {char for char in expression.replace("sqrt", "").replace("frac", "") if char.isalpha()}
    return len(letters) <= 2 and not _UNSAFE_FOR_SYMPY.search(expression)


def _sympy_equal(ground_truth: str, answer: str) -> bool:
    import sympy
    from sympy.parsing import sympy_parser

    difference = f"({ground_truth})-({answer})"
    if not _sympy_may_evaluate(difference):
        return False
    transformations = sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)
    try:
        return sympy.simplify(sympy_parser.parse_expr(difference.replace("^", "**"),
                                                      transformations=transformations)) == 0
    except Exception:  # noqa: BLE001 - what sympy cannot read is not equal
        return False


def _elements_equal(truth: str, given: str) -> bool:
    if _FRACTION.search(truth) and _FRACTION.search(given):
        return truth == given  # an unreduced fraction must be written the same
    if _is_integer_text(truth) != _is_integer_text(given):
        return False
    return _sympy_equal(truth, given)


def equivalent(answer: str, ground_truth: str) -> bool:
    if same_string(answer, ground_truth):
        return True
    truth, given = _tier2(ground_truth), _tier2(answer)
    if truth == given:
        return True
    if not given:
        return False
    truths, givens = _elements(truth), _elements(given)
    if len(truths) > 1 and (truth[0] != given[0] or truth[-1] != given[-1]):
        return False
    return len(truths) == len(givens) and all(_elements_equal(t, g) for t, g in zip(truths, givens))
