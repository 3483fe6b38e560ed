"""A chat answer's text turned into OpenAI's message parts: ``reasoning_content``, ``content`` and
``tool_calls``, streamed as deltas or returned whole.

``AnswerParser`` decides, for one request, how the generated text is read:

- the reasoning parser of the model (``--reasoning-parser``) splits off the thinking, unless decoding
  was constrained to a grammar (the output is then the constrained text from its first token);
- with ``tool_choice`` ``auto`` the tool-call parser of the model (``--tool-call-parser``) finds calls;
- with ``tool_choice`` ``required`` or a named function, decoding was constrained to JSON
  (``tool_choice_schema``): ``[{"name", "parameters"}, ...]`` or the named function's arguments;
- ``gpt-oss`` reads harmony for both (``frontend.harmony``).

``AnswerStream`` re-parses all the text so far on every push (parsers are prefix-stable, see
``tools.base``) and emits what grew since the last push: O(n^2) in the answer length, a few
milliseconds for answers of thousands of tokens, paid only by requests that use these features.
Trailing whitespace is held back until more text follows, so whitespace between a text and a tool
call never reaches the client.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from dynamo_worker.frontend.harmony import HARMONY_TOKENS, parse_harmony
from dynamo_worker.frontend.reasoning import ReasoningParser
from dynamo_worker.frontend.tools import HARMONY_PARSER, TOOL_PARSERS, Parsed, ToolCall

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

    def parse(self, text: str, final: bool) -> tuple[str, Parsed]:
        if self.tool_mode in ("required", "named"):
            return "", self._constrained(text, final)
        if self.harmony:
            reasoning, parsed = parse_harmony(text, final, tools=self.tool_mode == "auto")
        else:
            reasoning, rest = self.reasoning.split(text, final) if self.reasoning else ("", text)
            if self.tool_mode == "auto" and self.tool_parser in TOOL_PARSERS:
                parsed = TOOL_PARSERS[self.tool_parser].parse(rest, final)
            else:
                parsed = Parsed(rest)
        if not self.parallel and len(parsed.calls) > 1:
            parsed = Parsed(parsed.content, parsed.calls[:1])
        return reasoning, parsed

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
        calls = (
            [
                ToolCall(v["name"], json.dumps(v.get("parameters") or {}, ensure_ascii=False))
                for v in value
                if isinstance(v, dict) and isinstance(v.get("name"), str)
            ]
            if isinstance(value, list)
            else []
        )
        if not calls:
            return Parsed(text)
        return Parsed("", calls if self.parallel else calls[:1])


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class AnswerStream:
    """Feeds text in, gets OpenAI ``delta`` dicts out; ``message`` gives the whole answer at the end."""

    parser: AnswerParser
    text: str = ""
    reasoning: str = ""
    content: str = ""
    calls: list[tuple[str, ToolCall]] = field(default_factory=list)  # (id, call) as emitted

    def push(self, text: str, final: bool = False) -> list[dict[str, Any]]:
        self.text += text
        reasoning, parsed = self.parser.parse(self.text, final)
        deltas: list[dict[str, Any]] = []
        reasoning = reasoning.rstrip()
        content = parsed.content.rstrip() if (not final or parsed.calls or self.calls) else parsed.content
        if reasoning.startswith(self.reasoning) and len(reasoning) > len(self.reasoning):
            deltas.append({"reasoning_content": reasoning[len(self.reasoning) :]})
            self.reasoning = reasoning
        if content.startswith(self.content) and len(content) > len(self.content):
            deltas.append({"content": content[len(self.content) :]})
            self.content = content
        for call in parsed.calls[len(self.calls) :]:
            index, call_id = len(self.calls), _call_id()
            self.calls.append((call_id, call))
            head = {"index": index, "id": call_id, "type": "function"}
            deltas.append({"tool_calls": [head | {"function": {"name": call.name, "arguments": ""}}]})
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]})
        return deltas

    def finish(self) -> list[dict[str, Any]]:
        return self.push("", final=True)

    def message(self) -> dict[str, Any]:
        """The whole assistant message (after ``finish``)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if not self.calls and not self.content:
            message["content"] = ""
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.calls:
            message["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for i, c in self.calls
            ]
        return message
