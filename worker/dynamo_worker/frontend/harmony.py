"""OpenAI's harmony format (gpt-oss), written for this project: reasoning, tool calls and content.

A gpt-oss answer is a sequence of messages, each ``[<|start|>assistant]<|channel|>CHANNEL[ to=RECIPIENT]
[<|constrain|>FORMAT]<|message|>BODY`` ended by ``<|end|>``, ``<|call|>`` or ``<|return|>`` (the last
two are eos tokens, so the worker does not return them and the text just ends). Channels:
``analysis`` is reasoning (``reasoning_content``); ``commentary`` addressed ``to=functions.NAME`` is a
tool call whose body is the JSON arguments; ``final`` (and a commentary preamble without recipient) is
the content. The same parse serves ``--reasoning-parser gpt-oss`` and ``--tool-call-parser gpt-oss``.
Prefix-stable like every parser here (``tools.base``): bodies stream as they grow, minus a partial
special token at their end; a tool call appears once its message is complete.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from dynamo_worker.frontend.tools.base import Parsed, ToolCall, held_back

__all__ = ["HARMONY_TOKENS", "HarmonyMessage", "harmony_messages", "parse_harmony"]

HARMONY_TOKENS = (
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<|constrain|>",
)
_ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


@dataclass(frozen=True)
class HarmonyMessage:
    channel: str
    recipient: str | None
    body: str
    complete: bool


def harmony_messages(text: str, final: bool) -> list[HarmonyMessage]:
    out: list[HarmonyMessage] = []
    pos = 0
    while pos < len(text):
        m = text.find("<|message|>", pos)
        if m < 0:
            rest = text[pos:]
            if final and not any(t in rest for t in HARMONY_TOKENS) and rest.strip():
                out.append(HarmonyMessage("final", None, rest, True))  # plain text: no harmony at all
            break
        header = text[pos:m]
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        start = m + len("<|message|>")
        ends = [(i, t) for t in _ENDS if (i := text.find(t, start)) >= 0]
        if not ends:
            body = text[start:]
            if not final:
                body = body[: len(body) - held_back(body, HARMONY_TOKENS)]
            out.append(
                HarmonyMessage(
                    channel.group(1) if channel else "final",
                    recipient.group(1) if recipient else None,
                    body,
                    final,
                )
            )
            break
        end, token = min(ends)
        out.append(
            HarmonyMessage(
                channel.group(1) if channel else "final",
                recipient.group(1) if recipient else None,
                text[start:end],
                True,
            )
        )
        pos = end if token == "<|start|>" else end + len(token)
    return out


def parse_harmony(text: str, final: bool, tools: bool) -> tuple[str, Parsed]:
    """(reasoning, content and calls) of a harmony answer. Without ``tools`` a function call's message
    is content (the caller offered no tools, so there is nothing to call)."""
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[ToolCall] = []
    for msg in harmony_messages(text, final):
        if msg.channel == "analysis":
            reasoning.append(msg.body)
        elif tools and msg.recipient and msg.recipient.startswith("functions."):
            if msg.complete:
                calls.append(ToolCall(msg.recipient[len("functions.") :], _arguments(msg.body)))
        else:
            content.append(msg.body)
    return "".join(reasoning), Parsed("".join(content), calls)


def _arguments(body: str) -> str:
    try:
        value = json.loads(body)
    except ValueError:
        return json.dumps({"input": body.strip()}) if body.strip() else "{}"
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else json.dumps({"input": value})
