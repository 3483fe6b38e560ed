"""The soak's traffic: OpenAI requests of every kind the graph serves, sent at a steady rate with the
official ``openai`` client, each judged on its own.

Kinds (in turn): a streamed chat, a streamed completion, a chat with a long prompt (more KV blocks to
move from prefill to decode), embeddings (the embedding worker), and a chat with tools that the
workers answer with a tool call (their ``--script``). Every chat and completion goes through a
prefill and a decode worker (the graph is disaggregated).

Each request ends in one of four outcomes, within ``bound_s`` of being sent:
- ``answered``: complete and right: ``finish_reason`` given, every asked-for token counted once in the
  usage (``ignore_eos``), the tool call parsed, one vector per input;
- ``errored``: a clear error (an HTTP error status, an error event in the stream, a refused or reset
  connection) before the bound;
- ``hung``: nothing conclusive by the bound;
- ``lost``: an answer that is not a clear error and not right either (a stream that stops without a
  finish reason or an error event, missing or doubled tokens, a missing tool call or vector).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import openai

__all__ = ["EMBED", "KINDS", "LLM", "TOOL_PROMPT", "TOOL_REPLY", "Outcome", "Traffic"]

LLM = "soak"
EMBED = "soak-embed"
MAX_TOKENS = 32
TOOL_PROMPT = "Use the tool: what is the weather in Paris?"
TOOL_REPLY = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
]


@dataclass
class Outcome:
    kind: str
    sent_at: float  # seconds since the soak started
    status: str = "hung"  # answered | errored | hung | lost
    seconds: float = 0.0  # from sending to the outcome
    ttft_s: float | None = None  # streamed requests: to the first token
    detail: str = ""  # for errored and lost: what was seen


class Wrong(Exception):
    """An answer that is not right (a lost request)."""


def _prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _error_detail(e: BaseException) -> str:
    if isinstance(e, openai.APIStatusError):
        return f"{e.status_code} {(e.body or {}).get('code') if isinstance(e.body, dict) else ''}".strip()
    if isinstance(e, openai.APIConnectionError):
        return "connection"
    if isinstance(e, openai.APIError):
        return "error event"
    return type(e).__name__


@dataclass
class Traffic:
    """Sends ``rate`` requests a second to ``client`` until ``stop`` is set; ``outcomes`` collects them."""

    client: openai.AsyncOpenAI
    rate: float
    bound_s: float
    started: float = field(default_factory=time.monotonic)
    seed: int = 0
    outcomes: list[Outcome] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    async def run(self, stop: asyncio.Event) -> None:
        """Send at a steady rate (the schedule does not slip when requests are slow), then wait for the
        requests in flight (each ends within its bound)."""
        kinds = list(KINDS.items())
        n = 0
        while not stop.is_set():
            name, send = kinds[n % len(kinds)]
            task = asyncio.create_task(self._one(name, send))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            n += 1
            delay = self.started + n / self.rate - time.monotonic()
            if delay > 0:
                try:
                    async with asyncio.timeout(delay):
                        await stop.wait()
                except TimeoutError:
                    pass
        if self._tasks:
            await asyncio.gather(*self._tasks)

    async def _one(self, kind: str, send: Callable[[Traffic, Outcome], Awaitable[None]]) -> None:
        sent = time.monotonic()
        outcome = Outcome(kind, sent - self.started)
        self.outcomes.append(outcome)
        try:
            async with asyncio.timeout(self.bound_s):
                await send(self, outcome)
            outcome.status = "answered"
        except TimeoutError:
            outcome.status, outcome.detail = "hung", f"nothing by the {self.bound_s:g}s bound"
        except Wrong as e:
            outcome.status, outcome.detail = "lost", str(e)
        except openai.APIError as e:
            outcome.status, outcome.detail = "errored", _error_detail(e)
        except Exception as e:
            outcome.status, outcome.detail = "lost", f"{type(e).__name__}: {e}"
        outcome.seconds = time.monotonic() - sent

    # --- the kinds ---------------------------------------------------------------------------------

    async def chat_stream(self, outcome: Outcome, words: int = 12) -> None:
        stream = await self.client.chat.completions.create(
            model=LLM,
            messages=[{"role": "user", "content": _prompt(self.rng, words)}],
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        await self._consume(stream, outcome, lambda c: c.choices[0].delta.content)

    async def completion_stream(self, outcome: Outcome) -> None:
        stream = await self.client.completions.create(
            model=LLM,
            prompt=_prompt(self.rng, 12),
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        await self._consume(stream, outcome, lambda c: c.choices[0].text)

    async def long_chat(self, outcome: Outcome) -> None:
        await self.chat_stream(outcome, words=400)

    async def _consume(self, stream, outcome: Outcome, text: Callable) -> None:
        sent = self.started + outcome.sent_at
        finish, usage = None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if not chunk.choices:
                continue
            if outcome.ttft_s is None and text(chunk):
                outcome.ttft_s = time.monotonic() - sent
            finish = chunk.choices[0].finish_reason or finish
        if finish != "length":
            raise Wrong(f"stream ended with finish_reason={finish!r} and no error event")
        if usage is None or usage.completion_tokens != MAX_TOKENS:
            got = usage.completion_tokens if usage else None
            raise Wrong(f"usage counts {got} completion tokens, {MAX_TOKENS} were streamed")

    async def embeddings(self, _: Outcome) -> None:
        inputs = [_prompt(self.rng, 8), _prompt(self.rng, 8)]
        r = await self.client.embeddings.create(model=EMBED, input=inputs)
        if len(r.data) != 2 or not all(d.embedding for d in r.data):
            raise Wrong(f"{len(r.data)} vectors for 2 inputs")

    async def tool_call(self, _: Outcome) -> None:
        r = await self.client.chat.completions.create(
            model=LLM, messages=[{"role": "user", "content": TOOL_PROMPT}], tools=TOOLS, max_tokens=64
        )
        calls = r.choices[0].message.tool_calls or []
        if r.choices[0].finish_reason != "tool_calls" or [c.function.name for c in calls] != ["get_weather"]:
            raise Wrong(f"finish_reason={r.choices[0].finish_reason!r}, tool calls {calls!r}")


KINDS: dict[str, Callable[[Traffic, Outcome], Awaitable[None]]] = {
    "chat (stream)": Traffic.chat_stream,
    "completion (stream)": Traffic.completion_stream,
    "embeddings": Traffic.embeddings,
    "chat, long prompt": Traffic.long_chat,
    "tool call": Traffic.tool_call,
}
