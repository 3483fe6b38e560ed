"""What every tool-call parser shares: the call it finds, the parse contract, and small text helpers.

Contract (``ToolParser.parse(text, final)``): given *all* the text generated so far, return the plain
content and the complete tool calls found in it. While ``final`` is False, the result must be
*prefix-stable*: a later call with more text returns content that extends this content and calls that
extend this list. Parsers achieve that by holding back what is still ambiguous: the beginning of a
marker at the end of the text, and a call whose end has not arrived. With ``final`` True the text is
complete and whatever is held is decided (an unterminated call that parses is a call, else content).
The streaming layer (``output.chat_output``) turns successive results into OpenAI deltas, re-parsing
only from the last *settled* point a parser reports (``Parsed.settled``).
"""

from __future__ import annotations

import abc
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = ["Parsed", "ToolCall", "ToolParser", "call_from_obj", "held_back", "parse_json_prefix"]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's ``function.arguments``)


@dataclass
class Parsed:
    """Content and calls, and how much of them is *settled*: ``text[:settled]`` is decided for good
    (it gave the first ``settled_content`` characters of ``content`` and the first ``settled_calls``
    calls), and parsing may restart at ``settled`` as if the text began there. The streaming layer
    keeps settled results and re-parses only the rest, so a long answer costs linear time. 0 (the
    default) settles nothing, which is always correct."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    settled: int = 0
    settled_content: int = 0
    settled_calls: int = 0


class ToolParser(abc.ABC):
    """One model family's tool-call format, selected by SGLang's ``--tool-call-parser`` name."""

    names: ClassVar[tuple[str, ...]]
    # special tokens the format needs to see in the detokenized text (others are skipped as usual)
    keep_special: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def parse(self, text: str, final: bool, at_start: bool = True) -> Parsed:
        """Content and complete calls in ``text``; prefix-stable while not ``final`` (module doc).
        ``at_start``: ``text`` begins the answer (False when the caller restarts at a settled point)."""


def held_back(text: str, markers: Iterable[str]) -> int:
    """How many characters at the end of ``text`` could be the start of one of ``markers``."""
    markers = tuple(markers)
    window = text[-max(len(m) for m in markers) :]
    if not any(m[0] in window for m in markers):
        return 0  # the common case, decided without slicing per marker
    best = 0
    for marker in markers:
        for k in range(min(len(text), len(marker) - 1), best, -1):
            if marker.startswith(text[-k:]):
                best = k
                break
    return best


def _arguments(value: Any) -> str | None:
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, str):  # some models emit the arguments as a JSON string
        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        return json.dumps(parsed, ensure_ascii=False) if isinstance(parsed, dict) else None
    return None


def call_from_obj(obj: Any, keys: tuple[str, ...] = ("arguments", "parameters")) -> ToolCall | None:
    """``{"name": ..., "arguments"|"parameters": {...}}`` as a call, else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    for key in keys:
        if key in obj:
            args = _arguments(obj[key])
            return ToolCall(obj["name"], args) if args is not None else None
    return ToolCall(obj["name"], "{}")


_DECODER = json.JSONDecoder()


def parse_json_prefix(text: str, pos: int = 0) -> tuple[Any, int] | None:
    """The JSON value starting at ``pos`` (after whitespace) and where it ends, or None when there is
    no complete value there (yet)."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    try:
        return _DECODER.raw_decode(text, pos)
    except ValueError:
        return None
