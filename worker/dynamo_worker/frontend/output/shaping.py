"""Response shaping: pure functions from results to the bodies of ``protocol``, and the SSE
events of a streamed chat or completion answer (``StreamEvents``), plain or with features.

Nothing here does I/O or reads a clock; the same input gives the same bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from dynamo_worker.frontend.errors import UpstreamError
from dynamo_worker.frontend.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
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
    "StreamEvents",
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


def model_card(name: str, created: int, *, root: str | None = None, parent: str | None = None) -> ModelCard:
    """A model of ``/v1/models``; a LoRA adapter with ``root`` (its source) and ``parent`` (its model)."""
    return ModelCard(id=name, created=created, root=root, parent=parent)


def model_list(cards: list[ModelCard]) -> ModelList:
    return ModelList(data=cards)


def health(served: list[str], namespace: str, starting: Sequence[str] = ()) -> tuple[int, Health]:
    """(HTTP status, body) of ``/health``: healthy while some model is listed (served, or kept while it
    scales up: ``models.registry``) and none is ``starting`` (its first prefill/decode pairs are being
    warmed up, bounded: ``serving.warmup``)."""
    if starting:
        reason = (
            f"opening the KV transfer connections of the first prefill/decode pairs of {', '.join(starting)} "
            "(a warm-up request through each; bounded by --pair-warmup-timeout-s)"
        )
        return 503, Health(status="unhealthy", models=served, reason=reason)
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


def whole(
    head: Head,
    text: str,
    finish: FinishReason,
    use: Usage,
    *,
    message: AssistantMessage | None = None,
    logprobs: ChatLogprobs | CompletionLogprobs | None = None,
) -> ChatCompletion | Completion:
    """The answer of a request that did not stream: ``text``, or for chat the parsed ``message`` when
    tools or reasoning shaped it, with the ``logprobs`` of its tokens when asked for."""
    if head.kind == "chat":
        assert not isinstance(logprobs, CompletionLogprobs)
        if message is None:
            message = AssistantMessage(content=text)
        choice = ChatChoice(message=message, logprobs=logprobs, finish_reason=finish)
        return ChatCompletion(id=head.id, created=head.created, model=head.model, choices=[choice], usage=use)
    assert not isinstance(logprobs, ChatLogprobs)
    return Completion(
        id=head.id,
        created=head.created,
        model=head.model,
        choices=[CompletionChoice(text=text, logprobs=logprobs, finish_reason=finish)],
        usage=use,
    )


Choice = ChatChunkChoice | CompletionChoice

_MARK = "\x00"  # stands for a text in a template: no tokenizer's text is a lone NUL
_ROLE_JSON = dump(ChatChunkChoice(delta=ChatDelta(role="assistant", content="")))


def _choice(kind: str, text: str, finish: FinishReason | None) -> Choice:
    if kind == "chat":
        return ChatChunkChoice(delta=ChatDelta(content=text or None), finish_reason=finish)
    return CompletionChoice(text=text, finish_reason=finish)


@functools.cache
def _recurring(kind: str, text: str, finish: FinishReason | None) -> tuple[Choice, bytes]:
    """A choice that recurs in every stream (a mark, an empty final one) and its JSON, made once."""
    choice = _choice(kind, text, finish)
    return choice, dump(choice)


class StreamEvents:
    """The SSE events of one streamed answer: ``role`` (chat only), ``text`` per token (or ``event`` per
    delta of an answer with features), ``final`` with the finish reason, ``usage`` when asked for, then
    ``SSE_DONE``.

    Every event is rendered from ``protocol`` models, but each model only once: the chunk around
    the choice (the same in every event of a request but the usage one) once per request, a choice
    that recurs once per process; an event joins their bytes. A mid-stream text chunk is the same JSON
    every time but for its text, so ``text`` splices the text (``orjson``) into the bytes of its choice
    rendered around a mark. The bytes are those of building and dumping the whole chunk per event
    (``test_frontend_shaping`` checks it), which measured 5 us an event against 0.2 us for the splice,
    while the whole frontend spends about 32 us of CPU per streamed token (``make bench``, scenario
    frontend): a model per token would cost some 15% of tokens/s, far more than the 3% allowed.
    """

    def __init__(self, head: Head) -> None:
        self.head = head
        mark, mark_json = _recurring(head.kind, _MARK, None)
        body = ChatCompletionChunk if head.kind == "chat" else Completion
        chunk = body(id=head.id, created=head.created, model=head.model, choices=[mark])
        # Unambiguous splits: a choice's JSON can occur in the chunk only as the choice (inside a JSON
        # string its quotes would be escaped), and the mark's JSON only once in the choice.
        before, after = dump(chunk, exclude=None if head.include_usage else {"usage"}).split(mark_json)
        text_before, text_after = mark_json.split(orjson.dumps(_MARK))
        self._before, self._after = b"data: " + before, after + b"\n\n"
        self._text_before, self._text_after = self._before + text_before, text_after + self._after

    def role(self) -> bytes:
        """The first event of a chat stream: the assistant's role, no text yet."""
        return self._before + _ROLE_JSON + self._after

    def text(self, text: str) -> bytes:
        """A mid-stream event for a non-empty ``text``."""
        return self._text_before + orjson.dumps(text) + self._text_after

    def final(self, text: str, finish: FinishReason) -> bytes:
        """The event with the finish reason (and the last text, if any)."""
        kind = self.head.kind
        choice = dump(_choice(kind, text, finish)) if text else _recurring(kind, "", finish)[1]
        return self._before + choice + self._after

    def event(
        self,
        delta: ChatDelta | str,
        logprobs: ChatLogprobs | CompletionLogprobs | None = None,
        finish: FinishReason | None = None,
    ) -> bytes:
        """An event of an answer with features: a chat ``delta`` (reasoning, content, tool calls) or a
        completion's text, with the logprobs of its tokens."""
        if isinstance(delta, ChatDelta):
            assert not isinstance(logprobs, CompletionLogprobs)
            choice: Choice = ChatChunkChoice(delta=delta, logprobs=logprobs, finish_reason=finish)
        else:
            assert not isinstance(logprobs, ChatLogprobs)
            choice = CompletionChoice(text=delta, logprobs=logprobs, finish_reason=finish)
        return self._before + dump(choice) + self._after

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
