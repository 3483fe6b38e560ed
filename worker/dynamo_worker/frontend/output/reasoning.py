"""Reasoning parsers: split a reasoning model's thinking (``reasoning_content``) from its answer.

Written for this project; the names are SGLang's ``--reasoning-parser`` values:

- ``deepseek-r1``, ``qwen3-thinking``: the chat template opens the thinking block, so the output is
  reasoning until ``</think>`` (a leading ``<think>`` is dropped); an output that never closes it is
  all reasoning.
- ``qwen3``: reasoning only when the output starts with ``<think>`` (Qwen3 with thinking enabled);
  otherwise all of it is content.
- ``gpt-oss``: harmony's ``analysis`` channel (``output.harmony``).

``ReasoningParser.splitter()`` splits one answer as it streams (``ReasoningSplitter``); the rest then
goes to the tool-call parser.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamo_worker.frontend.output.tools.base import held_back

__all__ = ["REASONING_PARSERS", "ReasoningParser"]

THINK, END_THINK = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    forced: bool  # the template already opened the thinking block
    harmony: bool = False

    @property
    def keep_special(self) -> tuple[str, ...]:
        return () if self.harmony else (THINK, END_THINK)

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.forced)


class ReasoningSplitter:
    """Splits one answer as it streams: ``push(text, final)`` returns the new reasoning and the new
    rest (the answer, for the tool-call parser). Newlines after ``<think>`` and whitespace around
    ``</think>`` are dropped; whitespace at the end of the reasoning is held until more follows.
    Linear in the answer's length (only the unsent tail is searched)."""

    def __init__(self, forced: bool) -> None:
        self.forced = forced
        self.phase = "start"  # -> "think" -> "answer"
        self.buf = ""
        self.started = False  # the current phase's first visible character was seen

    def push(self, text: str, final: bool) -> tuple[str, str]:
        self.buf += text
        reasoning = ""
        if self.phase == "start":
            body = self.buf.lstrip()
            if body.startswith(THINK):
                self.buf, self.phase = body[len(THINK) :], "think"
            elif not final and THINK.startswith(body):
                return "", ""  # could still become "<think>"
            elif self.forced:
                self.buf, self.phase = body, "think"
            else:
                self.phase = "answer"
        if self.phase == "think":
            if not self.started:
                self.buf = self.buf.lstrip("\n")
                self.started = bool(self.buf)
            end = self.buf.find(END_THINK)
            if end < 0:
                keep = 0 if final else held_back(self.buf, (END_THINK,))
                reasoning = self.buf[: len(self.buf) - keep].rstrip()
                self.buf = "" if final else self.buf[len(reasoning) :]
                return reasoning, ""
            reasoning = self.buf[:end].rstrip()
            self.buf, self.phase, self.started = self.buf[end + len(END_THINK) :], "answer", False
        if not self.started:
            self.buf = self.buf.lstrip()
            self.started = bool(self.buf)
        rest, self.buf = self.buf, ""
        return reasoning, rest


REASONING_PARSERS = {
    "deepseek-r1": ReasoningParser("deepseek-r1", forced=True),
    "qwen3-thinking": ReasoningParser("qwen3-thinking", forced=True),
    "qwen3": ReasoningParser("qwen3", forced=False),
    "gpt-oss": ReasoningParser("gpt-oss", forced=False, harmony=True),
}
