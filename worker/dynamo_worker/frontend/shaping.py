"""Response shaping: pure functions from results to the bodies of ``frontend.responses``, and the SSE
events of a plain (featureless) chat or completion stream.

Nothing here does I/O or reads a clock; the same input gives the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from dynamo_worker.frontend.errors import UpstreamError
from dynamo_worker.frontend.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    Completion,
    CompletionChoice,
    FinishReason,
    Health,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    Usage,
    dump,
)

__all__ = [
    "SSE_DONE",
    "Head",
    "PlainStream",
    "finish_reason",
    "health",
    "model_card",
    "model_list",
    "sse",
    "usage",
    "whole",
]

SSE_DONE = b"data: [DONE]\n\n"

# Worker finish reasons as OpenAI's. "error" chunks never get here (the dispatcher raises them), and a
# "cancelled" one is an error too: the output was cut short, which "stop" would hide from the client.
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length"}


def finish_reason(worker_reason: str) -> FinishReason:
    """The OpenAI finish reason of a worker's; raises ``UpstreamError`` for a worker that ended the
    request on its own."""
    try:
        return _FINISH[worker_reason]
    except KeyError:
        raise UpstreamError(
            f"The worker ended the request early (finish_reason={worker_reason}) without being asked to; "
            "retry it.",
            code="worker_cancelled",
        ) from None


def sse(body: bytes) -> bytes:
    """One server-sent event carrying the JSON ``body``."""
    return b"data: " + body + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


def model_card(name: str, created: int) -> ModelCard:
    return ModelCard(id=name, created=created)


def model_list(cards: list[ModelCard]) -> ModelList:
    return ModelList(data=cards)


def health(served: list[str], namespace: str) -> tuple[int, Health]:
    """(HTTP status, body) of ``/health``: healthy while some model can be served."""
    if served:
        return 200, Health(status="healthy", models=served)
    reason = (
        "no model can be served yet: no aggregated worker, or prefill and decode pair, "
        f"with a loaded model card in namespace '{namespace}'"
    )
    return 503, Health(status="unhealthy", models=[], reason=reason)


@dataclass(frozen=True)
class Head:
    """What every body of one answer starts with, and how it is shaped."""

    kind: str  # "chat" | "completion"
    id: str
    created: int
    model: str
    include_usage: bool = False  # stream_options.include_usage: chunks carry "usage"


def whole(head: Head, text: str, finish: FinishReason, use: Usage) -> ChatCompletion | Completion:
    """The answer of a request that did not stream."""
    if head.kind == "chat":
        choice = ChatChoice(message=AssistantMessage(content=text), finish_reason=finish)
        return ChatCompletion(id=head.id, created=head.created, model=head.model, choices=[choice], usage=use)
    return Completion(
        id=head.id,
        created=head.created,
        model=head.model,
        choices=[CompletionChoice(text=text, finish_reason=finish)],
        usage=use,
    )


class PlainStream:
    """The SSE events of one plain streamed answer: ``role`` (chat only), ``text`` per token,
    ``final`` with the finish reason, ``usage`` when asked for, then ``SSE_DONE``.

    Each event's body is a ``responses`` model, except on the hot path: a mid-stream text chunk is the
    same JSON every time but for its text, so ``text`` splices the text (``orjson``) between the bytes
    of that model rendered once per request, and gives the same bytes. Building and dumping the models
    per token measured about 15 us a chunk against 0.3 us for the splice (the whole frontend spends a
    few tens of us per streamed token), i.e. far more than the 3% of tokens/s a change may cost.
    """

    _MARK = "\x00"

    def __init__(self, head: Head) -> None:
        self.head = head
        self._exclude = None if head.include_usage else {"usage"}
        self._parts = self._event(self._MARK, None).split(orjson.dumps(self._MARK))

    def _chunk(self, choice: ChatChunkChoice | CompletionChoice, use: Usage | None) -> bytes:
        h = self.head
        if isinstance(choice, ChatChunkChoice):
            body: ChatCompletionChunk | Completion = ChatCompletionChunk(
                id=h.id, created=h.created, model=h.model, choices=[choice], usage=use
            )
        else:
            body = Completion(id=h.id, created=h.created, model=h.model, choices=[choice], usage=use)
        return sse(dump(body, exclude=self._exclude))

    def _event(self, text: str | None, finish: FinishReason | None, role: bool = False) -> bytes:
        if self.head.kind == "chat":
            delta = ChatDelta(role="assistant", content="") if role else ChatDelta()
            if text:
                delta.content = text
            return self._chunk(ChatChunkChoice(delta=delta, finish_reason=finish), None)
        return self._chunk(CompletionChoice(text=text or "", finish_reason=finish), None)

    def role(self) -> bytes:
        """The first event of a chat stream: the assistant's role, no text yet."""
        return self._event(None, None, role=True)

    def text(self, text: str) -> bytes:
        """A mid-stream event for a non-empty ``text``."""
        if len(self._parts) != 2:  # the mark occurs elsewhere too (a model name with a NUL in it)
            return self._event(text, None)
        return self._parts[0] + orjson.dumps(text) + self._parts[1]

    def final(self, text: str, finish: FinishReason) -> bytes:
        """The event with the finish reason (and the last text, if any)."""
        return self._event(text, finish)

    def usage(self, use: Usage) -> bytes:
        """The last event before ``SSE_DONE`` when the client asked for usage: no choices, the counts."""
        h = self.head
        if h.kind == "chat":
            body: ChatCompletionChunk | Completion = ChatCompletionChunk(
                id=h.id, created=h.created, model=h.model, choices=[], usage=use
            )
        else:
            body = Completion(id=h.id, created=h.created, model=h.model, choices=[], usage=use)
        return sse(dump(body))
