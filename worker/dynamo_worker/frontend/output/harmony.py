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

from dynamo_worker.frontend.output.tools.base import Parsed, ToolCall, held_back

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


Open = tuple[str, str | None]  # (channel, recipient) of a message whose body the text starts inside


def harmony_messages(
    text: str, final: bool, open_message: Open | None = None
) -> tuple[list[HarmonyMessage], int, Open | None]:
    """The messages in ``text``; where parsing may restart (after the last complete message, or inside
    the body of an unfinished one that is not a tool call); and that message's header when the restart
    point is inside it. ``open_message``: ``text`` starts inside the body of such a message."""
    out: list[HarmonyMessage] = []
    pos = settled = 0
    resume: Open | None = None
    while pos < len(text) or open_message is not None:
        if open_message is not None:
            (channel, recipient), start, open_message = open_message, 0, None
        else:
            m = text.find("<|message|>", pos)
            if m < 0:
                rest = text[pos:]
                if final and not any(t in rest for t in HARMONY_TOKENS) and rest.strip():
                    out.append(HarmonyMessage("final", None, rest, True))  # plain text: no harmony at all
                break
            header = text[pos:m]
            found_channel, found_recipient = _CHANNEL.search(header), _RECIPIENT.search(header)
            channel = found_channel.group(1) if found_channel else "final"
            recipient = found_recipient.group(1) if found_recipient else None
            start = m + len("<|message|>")
        ends = [(i, t) for t in _ENDS if (i := text.find(t, start)) >= 0]
        if not ends:
            body = text[start:]
            if not final:
                body = body[: len(body) - held_back(body, HARMONY_TOKENS)]
                if not (recipient or "").startswith("functions."):
                    settled, resume = start + len(body), (channel, recipient)
            out.append(HarmonyMessage(channel, recipient, body, final))
            break
        end, token = min(ends)
        out.append(HarmonyMessage(channel, recipient, text[start:end], True))
        pos = settled = end if token == "<|start|>" else end + len(token)
    return out, settled, resume


def parse_harmony(
    text: str, final: bool, tools: bool, open_message: Open | None = None
) -> tuple[str, int, Parsed, Open | None]:
    """(reasoning, how much of it is settled, content and calls, the open message to resume in) of a
    harmony answer (see ``harmony_messages`` for where it settles). Without ``tools`` a function
    call's message is content (the caller offered no tools, so there is nothing to call)."""
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[ToolCall] = []
    messages, settled, resume = harmony_messages(text, final, open_message)
    for msg in messages:
        if msg.channel == "analysis":
            reasoning.append(msg.body)
        elif tools and msg.recipient and msg.recipient.startswith("functions."):
            if msg.complete:
                calls.append(ToolCall(msg.recipient[len("functions.") :], _arguments(msg.body)))
        else:
            content.append(msg.body)
    # everything parsed is settled except an unfinished tool call, which adds nothing yet
    r, c = "".join(reasoning), "".join(content)
    parsed = Parsed(c, calls, settled, len(c) if settled else 0, len(calls) if settled else 0)
    return r, len(r) if settled else 0, parsed, resume


def _arguments(body: str) -> str:
    try:
        value = json.loads(body)
    except ValueError:
        return json.dumps({"input": body.strip()}) if body.strip() else "{}"
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else json.dumps({"input": value})
