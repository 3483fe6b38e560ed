"""A chat answer's text turned into OpenAI's message parts: ``reasoning_content``, ``content`` and
``tool_calls``, streamed as deltas or returned whole.

``AnswerParser`` decides, for one request, how the generated text is read:

- the reasoning parser of the model (``--reasoning-parser``) splits off the thinking, unless decoding
  was constrained to a grammar (the output is then the constrained text from its first token);
- with ``tool_choice`` ``auto`` the tool-call parser of the model (``--tool-call-parser``) finds calls;
- with ``tool_choice`` ``required`` or a named function, decoding was constrained to JSON
  (``tool_choice_schema``): ``[{"name", "parameters"}, ...]`` or the named function's arguments;
- ``gpt-oss`` reads harmony for both (``output.harmony``).

``AnswerStream`` splits reasoning as it streams (``reasoning.ReasoningSplitter``), then re-parses
the rest from the last point the tool-call parser *settled* (parsers are prefix-stable, see
``tools.base``) and emits what grew since the last push: linear in the answer's length, except
inside an unfinished tool call, which is re-read until it completes. Trailing whitespace is held back
until more text follows, so whitespace between a text and a tool call never reaches the client.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from dynamo_worker.frontend.output.harmony import HARMONY_TOKENS, Open, parse_harmony
from dynamo_worker.frontend.output.reasoning import ReasoningParser
from dynamo_worker.frontend.output.tools import HARMONY_PARSER, TOOL_PARSERS, Parsed, ToolCall
from dynamo_worker.frontend.protocol import (
    AssistantMessage,
    ChatDelta,
    ChatToolCall,
    ChatToolCallDelta,
    FunctionCall,
    FunctionDelta,
)

log = logging.getLogger(__name__)

__all__ = ["AnswerParser", "AnswerStream", "tool_choice_schema"]

ToolMode = Literal["off", "auto", "required", "named"]


def tool_choice_schema(tools: list[dict[str, Any]], named: str | None) -> dict[str, Any]:
    """The JSON schema decoding is constrained to for ``tool_choice`` required (an array of calls) or a
    named function (its parameters), as SGLang builds it."""

    def params(tool: dict[str, Any]) -> dict[str, Any]:
        return tool["function"].get("parameters") or {"type": "object", "properties": {}}

    if named is not None:
        return next(params(t) for t in tools if t["function"]["name"] == named)
    return {
        "type": "array",
        "minItems": 1,
        "items": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "enum": [t["function"]["name"]]},
                        "parameters": params(t),
                    },
                    "required": ["name", "parameters"],
                }
                for t in tools
            ]
        },
    }


@dataclass
class AnswerParser:
    reasoning: ReasoningParser | None = None
    tool_parser: str | None = None
    tool_mode: ToolMode = "off"
    named: str | None = None
    parallel: bool = True

    @property
    def harmony(self) -> bool:
        return (self.reasoning is not None and self.reasoning.harmony) or (
            self.tool_mode == "auto" and self.tool_parser == HARMONY_PARSER
        )

    def keep_special(self) -> frozenset[str]:
        """Special tokens the parsers need in the text (the rest are skipped when detokenizing)."""
        keep: set[str] = set()
        if self.harmony:
            keep.update(HARMONY_TOKENS)
        if self.reasoning is not None:
            keep.update(self.reasoning.keep_special)
        if self.tool_mode == "auto" and self.tool_parser in TOOL_PARSERS:
            keep.update(TOOL_PARSERS[self.tool_parser].keep_special)
        return frozenset(keep)

    def parse_rest(
        self, text: str, final: bool, at_start: bool, resume: Open | None = None
    ) -> tuple[str, int, Parsed, Open | None]:
        """(reasoning, settled reasoning, content and calls, harmony resume point) of the text after
        the reasoning split."""
        if self.tool_mode in ("required", "named"):
            return "", 0, self._constrained(text, final), None
        if self.harmony:
            return parse_harmony(text, final, self.tool_mode == "auto", resume)
        if self.tool_mode == "auto" and self.tool_parser in TOOL_PARSERS:
            return "", 0, TOOL_PARSERS[self.tool_parser].parse(text, final, at_start), None
        return "", 0, Parsed(text, [], len(text), len(text)), None

    def _constrained(self, text: str, final: bool) -> Parsed:
        if not final:
            return Parsed("")
        try:
            value = json.loads(text)
        except ValueError:
            return Parsed(text)
        if self.tool_mode == "named":
            if not isinstance(value, dict):
                return Parsed(text)
            return Parsed("", [ToolCall(self.named or "", json.dumps(value, ensure_ascii=False))])
        items = value if isinstance(value, list) else []
        calls = [
            ToolCall(v["name"], json.dumps(v.get("parameters") or {}, ensure_ascii=False))
            for v in items
            if isinstance(v, dict) and isinstance(v.get("name"), str)
        ]
        return Parsed("", calls) if calls else Parsed(text)


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class _Field:
    """One message field as it streams: what was sent, and whitespace at its end held back until
    more text follows it. ``follow`` takes the field's text from the unsettled part of a re-parse."""

    parts: list[str] = field(default_factory=list)
    pending: str = ""
    fed: int = 0  # characters of the unsettled part's text already taken

    def add(self, piece: str) -> str:
        if not piece:
            return ""
        text = self.pending + piece
        keep = len(text.rstrip())
        self.pending, out = text[keep:], text[:keep]
        if out:
            self.parts.append(out)
        return out

    def follow(self, unsettled: str, settled: int) -> str:
        out = self.add(unsettled[self.fed :])
        self.fed = len(unsettled) - settled
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        if out:
            self.parts.append(out)
        return out

    def text(self) -> str:
        return "".join(self.parts)


class AnswerStream:
    """Feeds text in, gets OpenAI ``delta``s out (``protocol.ChatDelta``); ``message`` gives the whole
    answer at the end. Only the text after the last settled point is re-parsed, so an answer costs
    linear time."""

    def __init__(self, parser: AnswerParser) -> None:
        self.parser = parser
        self._split = (
            parser.reasoning.splitter()
            if parser.reasoning is not None
            and not parser.harmony
            and parser.tool_mode not in ("required", "named")
            else None
        )
        self._tail = ""  # text after the last settled point
        self._restarted = False
        self._resume: Open | None = None  # harmony: the tail starts inside this message's body
        self._reasoning = _Field()
        self._content = _Field()
        self._calls_fed = 0  # calls of the unsettled part already taken
        self.calls: list[tuple[str, ToolCall]] = []  # (id, call) as emitted

    def push(self, text: str, final: bool = False) -> list[ChatDelta]:
        reasoning = ""
        if self._split is not None:
            reasoning, text = self._split.push(text, final)
            reasoning = self._reasoning.add(reasoning)
        self._tail += text
        unsettled_reasoning, settled_reasoning, parsed, resume = self.parser.parse_rest(
            self._tail, final, not self._restarted, self._resume
        )
        settle = parsed.settled if not final else 0
        if self._split is None:
            reasoning = self._reasoning.follow(unsettled_reasoning, settled_reasoning if settle else 0)
        content = self._content.follow(parsed.content, parsed.settled_content if settle else 0)
        new_calls = parsed.calls[self._calls_fed :]
        self._calls_fed = len(parsed.calls) - (parsed.settled_calls if settle else 0)
        if settle:
            self._tail, self._restarted, self._resume = self._tail[settle:], True, resume
        deltas: list[ChatDelta] = []
        if reasoning:
            deltas.append(ChatDelta(reasoning_content=reasoning))
        if final and not self.calls and not new_calls:
            content += self._content.flush()  # no tool call: the answer's own trailing whitespace
        if content:
            deltas.append(ChatDelta(content=content))
        for call in new_calls:
            if self.calls and not self.parser.parallel:
                break
            index, call_id = len(self.calls), _call_id()
            self.calls.append((call_id, call))
            named = ChatToolCallDelta(
                index=index, id=call_id, type="function", function=FunctionDelta(name=call.name, arguments="")
            )
            args = ChatToolCallDelta(index=index, function=FunctionDelta(arguments=call.arguments))
            deltas += [ChatDelta(tool_calls=[named]), ChatDelta(tool_calls=[args])]
        return deltas

    def finish(self) -> list[ChatDelta]:
        return self.push("", final=True)

    def message(self) -> AssistantMessage:
        """The whole assistant message (after ``finish``)."""
        content = self._content.text()
        calls = [
            ChatToolCall(id=i, function=FunctionCall(name=c.name, arguments=c.arguments))
            for i, c in self.calls
        ]
        return AssistantMessage(
            content=content or (None if calls else ""),
            reasoning_content=self._reasoning.text() or None,
            tool_calls=calls or None,
        )
