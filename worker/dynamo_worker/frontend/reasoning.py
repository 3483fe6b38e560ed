"""Reasoning parsers: split a reasoning model's thinking (``reasoning_content``) from its answer.

Written for this project; the names are SGLang's ``--reasoning-parser`` values:

- ``deepseek-r1``, ``qwen3-thinking``: the chat template opens the thinking block, so the output is
  reasoning until ``</think>`` (a leading ``<think>`` is dropped); an output that never closes it is
  all reasoning.
- ``qwen3``: reasoning only when the output starts with ``<think>`` (Qwen3 with thinking enabled);
  otherwise all of it is content.
- ``gpt-oss``: harmony's ``analysis`` channel (``frontend.harmony``).

``ReasoningParser.split(text, final)`` follows the prefix-stable contract of ``tools.base``: the
reasoning and the rest grow as the text grows; the rest then goes to the tool-call parser.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamo_worker.frontend.tools.base import held_back

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

    def split(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning, rest) of the text so far."""
        body = text.lstrip()
        if body.startswith(THINK):
            body = body[len(THINK) :]
        elif not self.forced:
            if not final and THINK.startswith(body):
                return "", ""  # could still become "<think>"
            return "", text
        elif not final and body and THINK.startswith(body):
            return "", ""
        end = body.find(END_THINK)
        if end < 0:
            reasoning = body if final else body[: len(body) - held_back(body, (END_THINK,))]
            return reasoning.lstrip("\n"), ""
        return body[:end].lstrip("\n"), body[end + len(END_THINK) :].lstrip()


REASONING_PARSERS = {
    "deepseek-r1": ReasoningParser("deepseek-r1", forced=True),
    "qwen3-thinking": ReasoningParser("qwen3-thinking", forced=True),
    "qwen3": ReasoningParser("qwen3", forced=False),
    "gpt-oss": ReasoningParser("gpt-oss", forced=False, harmony=True),
}
