"""Tool-call formats of the common model families, written for this project (not SGLang's code).

Each class parses one family's format; ``names`` are SGLang's ``--tool-call-parser`` values for it:

- ``llama3`` (Llama 3.1/3.2/3.3 JSON): ``<|python_tag|>{"name": "f", "parameters": {...}}``, or the
  bare JSON object(s) at the start of the output; several calls separated by ``;``.
- ``qwen`` / ``qwen25`` / ``hermes`` (Qwen 2.5/3, Hermes): ``<tool_call>\\n{"name": "f", "arguments":
  {...}}\\n</tool_call>``, one block per call, text allowed around them.
- ``mistral``: ``[TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]``, or the newer
  ``[TOOL_CALLS]f[ARGS]{...}`` per call.
- ``deepseekv3``: ``<|tool_calls_begin|><|tool_call_begin|>function<|tool_sep|>f\\n```json\\n{...}\\n```
  <|tool_call_end|>...<|tool_calls_end|>``; ``deepseekv31``: ``<|tool_call_begin|>f<|tool_sep|>{...}
  <|tool_call_end|>`` inside the same outer markers. (DeepSeek writes these markers with a fullwidth
  bar U+FF5C and U+2581 for the underscore; the constants below spell them so.)
- ``gpt-oss`` (harmony): ``output.harmony``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from dynamo_worker.frontend.output.tools.base import (
    Parsed,
    ToolCall,
    ToolParser,
    call_from_obj,
    held_back,
    parse_json_prefix,
)

__all__ = ["DeepSeekV3Parser", "DeepSeekV31Parser", "HermesParser", "Llama3Parser", "MistralParser"]


def _blocks(
    text: str, final: bool, start: str, end: str, body: Callable[[str], list[ToolCall] | None]
) -> Parsed:
    """Content outside ``start``...``end`` blocks, and the calls ``body`` finds inside them. A block
    whose body is not a call stays content; an unterminated one is held until the text is final.
    Settled: everything before an unterminated block, or before a held-back partial marker."""
    content: list[str] = []
    calls: list[ToolCall] = []
    pos = size = 0
    settled = settled_content = settled_calls = 0
    while True:
        i = text.find(start, pos)
        if i < 0:
            tail = text[pos:]
            tail = tail if final else tail[: len(tail) - held_back(tail, (start,))]
            content.append(tail)
            size += len(tail)
            settled, settled_content, settled_calls = pos + len(tail), size, len(calls)
            break
        content.append(text[pos:i])
        size += i - pos
        settled, settled_content, settled_calls = i, size, len(calls)
        j = text.find(end, i + len(start))
        if j < 0:
            if final:
                found = body(text[i + len(start) :])
                if found:
                    calls.extend(found)
                else:
                    content.append(text[i:])
            break
        found = body(text[i + len(start) : j])
        if found is None:
            content.append(text[i : j + len(end)])
            size += j + len(end) - i
        else:
            calls.extend(found)
        pos = j + len(end)
    return Parsed("".join(content), calls, settled, settled_content, settled_calls)


def _one_json_call(body: str) -> list[ToolCall] | None:
    try:
        call = call_from_obj(json.loads(body))
    except ValueError:
        return None
    return [call] if call is not None else None


class HermesParser(ToolParser):
    names = ("qwen", "qwen25", "hermes")
    START, END = "<tool_call>", "</tool_call>"
    keep_special = (START, END)

    def parse(self, text: str, final: bool, at_start: bool = True) -> Parsed:
        return _blocks(text, final, self.START, self.END, _one_json_call)


def _json_calls(text: str, pos: int, final: bool, separators: str) -> tuple[list[ToolCall], str]:
    """Consecutive JSON call objects (or arrays of them) from ``pos``, separated by whitespace or
    ``separators``; returns the calls and the text after them that is not a call (content; held back,
    i.e. empty, while not ``final``)."""
    calls: list[ToolCall] = []
    while True:
        while pos < len(text) and (text[pos].isspace() or text[pos] in separators):
            pos += 1
        if pos >= len(text):
            return calls, ""
        got = parse_json_prefix(text, pos)
        if got is None:
            return calls, text[pos:] if final else ""
        value, end = got
        items = value if isinstance(value, list) else [value]
        found = [call_from_obj(v) for v in items]
        if not items or any(c is None for c in found):
            return calls, text[pos:] if final else ""
        calls.extend(c for c in found if c is not None)
        pos = end


class Llama3Parser(ToolParser):
    names = ("llama3",)
    TAG = "<|python_tag|>"
    keep_special = (TAG,)

    def parse(self, text: str, final: bool, at_start: bool = True) -> Parsed:
        i = text.find(self.TAG)
        if i >= 0:
            calls, rest = _json_calls(text, i + len(self.TAG), final, ";")
            return Parsed(text[:i] + rest, calls, settled=i, settled_content=i)
        stripped = text.lstrip()
        if not at_start:  # bare JSON calls count only at the start of the answer
            held = 0 if final else held_back(text, (self.TAG,))
            return _plain(text[: len(text) - held])
        if stripped.startswith("{"):
            calls, rest = _json_calls(stripped, 0, final, ";")
            if not calls and final:
                return Parsed(text, [])
            return Parsed(rest, calls)
        if not stripped and not final:
            return Parsed("", [])
        held = 0 if final else held_back(text, (self.TAG,))
        return _plain(text[: len(text) - held])


def _plain(content: str) -> Parsed:
    """Text without any marker: all of it is content, and settled."""
    return Parsed(content, [], settled=len(content), settled_content=len(content))


class MistralParser(ToolParser):
    names = ("mistral",)
    TAG, ARGS = "[TOOL_CALLS]", "[ARGS]"
    keep_special = (TAG, ARGS, "[CALL_ID]")
    _NAME = re.compile(r"\s*([A-Za-z0-9_.-]+)(?:\[CALL_ID\][A-Za-z0-9]*)?\[ARGS\]")

    def parse(self, text: str, final: bool, at_start: bool = True) -> Parsed:
        i = text.find(self.TAG)
        if i < 0:
            held = 0 if final else held_back(text, (self.TAG,))
            return _plain(text[: len(text) - held])
        content, pos, calls = text[:i], i, []
        while True:
            if text.startswith(self.TAG, pos):
                pos += len(self.TAG)
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if pos >= len(text):
                break
            if text[pos] == "[":
                found, rest = _json_calls(text, pos, final, ",")
                calls.extend(found)
                content += rest
                break
            m = self._NAME.match(text, pos)
            got = parse_json_prefix(text, m.end()) if m else None
            if m is None or got is None or not isinstance(got[0], dict):
                if final:
                    content += text[pos:]
                break
            calls.append(ToolCall(m.group(1), json.dumps(got[0], ensure_ascii=False)))
            pos = got[1]
        return Parsed(content, calls, settled=i, settled_content=i)


def _deepseek(name: str) -> str:
    return "<\uff5c" + name.replace("_", "\u2581") + "\uff5c>"


_CALLS_BEGIN, _CALLS_END = _deepseek("tool_calls_begin"), _deepseek("tool_calls_end")
_CALL_BEGIN, _CALL_END, _SEP = _deepseek("tool_call_begin"), _deepseek("tool_call_end"), _deepseek("tool_sep")


class DeepSeekV3Parser(ToolParser):
    names = ("deepseekv3",)
    keep_special = (_CALLS_BEGIN, _CALLS_END, _CALL_BEGIN, _CALL_END, _SEP)
    _CALL = re.compile(
        re.escape(_CALL_BEGIN)
        + r"\s*function\s*"
        + re.escape(_SEP)
        + r"\s*([^\n]+?)\s*\n```(?:json)?\s*\n(.*?)\n```\s*"
        + "(?:"
        + re.escape(_CALL_END)
        + "|$)",
        re.DOTALL,
    )

    def _calls(self, body: str) -> list[ToolCall] | None:
        calls = []
        for m in self._CALL.finditer(body):
            try:
                args = json.loads(m.group(2))
            except ValueError:
                return None
            if not isinstance(args, dict):
                return None
            calls.append(ToolCall(m.group(1), json.dumps(args, ensure_ascii=False)))
        return calls or None

    def parse(self, text: str, final: bool, at_start: bool = True) -> Parsed:
        return _blocks(text, final, _CALLS_BEGIN, _CALLS_END, self._calls)


class DeepSeekV31Parser(DeepSeekV3Parser):
    names = ("deepseekv31",)
    _CALL = re.compile(
        re.escape(_CALL_BEGIN)
        + r"\s*([^<\s]+?)\s*"
        + re.escape(_SEP)
        + r"(.*?)"
        + "(?:"
        + re.escape(_CALL_END)
        + "|$)",
        re.DOTALL,
    )
