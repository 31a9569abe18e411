"""The Python tool's wire format: its system prompt, its calls and its responses.

The model asks for code execution the way Qwen2.5/Qwen3 chat templates teach tool use
(Hermes style): ``<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>``.
The result comes back as ``<tool_response>...</tool_response>`` in the next user turn. A
turn with no tool call commits the final answer, which must be in ``\\boxed{}``. The data
command writes ``SYSTEM_PROMPT`` into every tool-formatted prompt, so the protocol is
self-contained and needs no ``--data.tools_key``.

Everything inside a ``<tool_response>`` is neutralised first (``neutralise``): a fast
tokenizer turns the text ``<|im_end|>`` into the special token even with
``add_special_tokens=False``, so a program that prints chat markers could otherwise forge
turns (and a ``\\boxed{}`` answer) in the trajectory. Every special-token-shaped string
(``<|...|>``, DeepSeek's ``<｜...｜>``), every tag of this protocol and of the Qwen templates
(``PROTOCOL_MARKERS``) and every added token of the tokenizer in use (``tokenizer_markers``) gets
a backslash after its first character, so it tokenizes as plain text and still reads the same.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

TOOL_NAMES = frozenset({"python", "python_executor"})  # the latter is Molt's example tool's name
TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run a Python 3 program in a fresh sandbox (no network, no files kept) and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The program. Print what you need."}},
            "required": ["code"],
        },
    },
}
SYSTEM_PROMPT = (
    "You are a helpful assistant that solves math problems. You may call a Python interpreter to compute.\n\n"
    "# Tools\n\n<tools>\n" + json.dumps(TOOL_SCHEMA) + "\n</tools>\n\n"
    "To call it, reply with a JSON object inside <tool_call></tool_call> tags:\n"
    '<tool_call>\n{"name": "python", "arguments": {"code": "print(2 + 2)"}}\n</tool_call>\n'
    "The program's output comes back inside <tool_response></tool_response>. Each program runs on its own: "
    "nothing carries over between calls. When you are done, reply without a tool call and put the final "
    "answer within \\boxed{}."
)

PROTOCOL_MARKERS = (
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tools>", "</tools>",
    "<think>", "</think>", "<function=", "</function>", "<parameter=", "</parameter>",
)  # fmt: skip
_SPECIAL_TOKEN_SHAPES = (r"<\|[^|<>\s\\]{1,64}\|>", r"<｜[^｜<>\\]{1,64}｜>")
ESCAPE = "\\"

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPEN_TAG = "<tool_call>"


@dataclass(frozen=True)
class ToolCall:
    code: str | None  # None when the request was malformed
    error: str | None = None  # what was wrong, told to the model


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>`` in ``text``, in order; an unclosed one counts as malformed."""
    calls = [_parse_one(body) for body in _TOOL_CALL.findall(text)]
    if text.count(_OPEN_TAG) > len(calls):
        calls.append(ToolCall(code=None, error="a <tool_call> was opened but never closed with </tool_call>"))
    return calls


def _parse_one(body: str) -> ToolCall:
    try:
        request = json.loads(body.strip())
    except json.JSONDecodeError as exc:
        return ToolCall(code=None, error=f"the tool call is not valid JSON ({exc.msg})")
    if not isinstance(request, dict) or request.get("name") not in TOOL_NAMES:
        name = request.get("name") if isinstance(request, dict) else None
        return ToolCall(code=None, error=f"unknown tool {name!r}; the only tool is 'python'")
    arguments = request.get("arguments", {})
    if isinstance(arguments, str):  # some templates serialise arguments twice
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = {"code": arguments}
    code = arguments.get("code") if isinstance(arguments, dict) else None
    if not isinstance(code, str) or not code.strip():
        return ToolCall(code=None, error="the python tool needs a non-empty string argument 'code'")
    return ToolCall(code=code)


def tokenizer_markers(tokenizer) -> frozenset[str]:
    """The strings a tokenizer turns into special or added tokens wherever they appear."""
    markers = set(getattr(tokenizer, "all_special_tokens", None) or ())
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        markers.add(getattr(token, "content", str(token)))
    return frozenset(m for m in markers if len(m) > 1 and ESCAPE not in m)


@functools.lru_cache(maxsize=8)
def _marker_pattern(extra: frozenset[str]) -> re.Pattern:
    literals = sorted(set(PROTOCOL_MARKERS) | extra, key=len, reverse=True)
    return re.compile("|".join([*map(re.escape, literals), *_SPECIAL_TOKEN_SHAPES]))


def neutralise(text: str, extra_markers: frozenset[str] = frozenset()) -> str:
    """``text`` with every marker broken by a backslash after its first character. No marker
    contains a backslash, so none can form across an inserted one; repeating until nothing
    matches also breaks markers that overlapped a broken one."""
    pattern = _marker_pattern(extra_markers)
    while pattern.search(text):
        text = pattern.sub(lambda m: m[0][0] + ESCAPE + m[0][1:], text)
    return text


def tool_response(text: str, extra_markers: frozenset[str] = frozenset()) -> str:
    return f"<tool_response>\n{neutralise(text, extra_markers)}\n</tool_response>"
