"""The output side of a chat or completion, pure: from the worker's token ids to the bytes the client
gets. Nothing here does I/O or reads a clock; the same input gives the same bytes.

Text. ``IncrementalDetokenizer`` decodes a growing id sequence in small windows and emits only complete
characters: while the text decoded so far ends in U+FFFD (a multi-byte character split across
tokens), nothing is emitted until the following token completes it. It starts from the last few
prompt ids so tokenizers that mark word starts (SentencePiece's leading space) keep their spaces.

``StopStringMatcher`` cuts the text at the first stop string and never lets any part of one reach the
client: text that could be the beginning of a stop string is held back until the next chunk proves
it is not (or ends the stream).

``WindowDetokenizer`` does the same over any object with ``decode(ids, skip_special_tokens)`` (e.g. a
decoder that keeps the special tokens a tool-call parser needs) by decoding a small window twice per
chunk; ``OutputText`` uses ``IncrementalDetokenizer`` for a ``tokenizers.Tokenizer`` and it otherwise.

``KeepSpecialDecoder`` decodes like the preprocessor but keeps the special tokens a parser needs.

``OutputText`` combines them with stop token ids, fed chunk by chunk.

Logprobs. Token logprobs as OpenAI sends them: ``{"content": [...]}`` for chat and ``{"tokens",
"token_logprobs", "top_logprobs", "text_offset"}`` for completions (``protocol.ChatLogprobs``,
``protocol.CompletionLogprobs``). The worker sends one per token with its chunks; ``Logprobs`` collects
them until the next event takes them (so a parser holding text back never separates a token from its
logprob for long).

Bodies and events: pure functions from results to the bodies of ``protocol``, and the SSE events of a
streamed chat or completion answer (``StreamEvents``), plain or with features.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import orjson
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from dynamo_worker.frontend.errors import UpstreamError
from dynamo_worker.frontend.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    ChatTokenLogprob,
    ChatTopLogprob,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionUsage,
    FinishReason,
    Health,
    ListedModel,
    ModelList,
    PromptTokensDetails,
    dump,
)
from dynamo_worker.protocol import TokenLogprob as WorkerLogprob

__all__ = [
    "SSE_DONE",
    "Decoder",
    "Delta",
    "Head",
    "IncrementalDetokenizer",
    "KeepSpecialDecoder",
    "Logprobs",
    "OutputText",
    "StopStringMatcher",
    "StreamEvents",
    "WindowDetokenizer",
    "finish_reason",
    "health",
    "listed_model",
    "model_list",
    "sse",
    "usage",
    "whole",
]


# --- text -----------------------------------------------------------------------------------------

REPLACEMENT = "\ufffd"
_CONTEXT_IDS = 5  # earlier ids kept in the decode window (enough for SentencePiece word starts)


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Streams text with the ``tokenizers`` library's ``DecodeStream`` (its window and UTF-8 handling
    run in Rust: one call per chunk instead of two full decodes of a Python-kept window)."""

    def __init__(
        self, tokenizer: Tokenizer, context_ids: Sequence[int] = (), skip_special_tokens: bool = True
    ):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._last: list[int] = list(context_ids[-_CONTEXT_IDS:])  # ids of the latest emitted text
        self._stream = DecodeStream(ids=self._last, skip_special_tokens=skip_special_tokens)
        self._held: list[int] = []  # ids whose text is not complete yet

    def push(self, token_ids: Sequence[int]) -> str:
        """Add ids; return the newly completed text (possibly empty)."""
        if not token_ids:
            return ""
        ids = token_ids if isinstance(token_ids, list) else list(token_ids)
        text = self._stream.step(self._tok, ids)
        if text is None:  # nothing new yet, or a character still incomplete
            self._held.extend(ids)
            return ""
        self._last, self._held = [*self._held, *ids][-_CONTEXT_IDS:], []
        return text

    def push_each(self, token_ids: Sequence[int]) -> list[str]:
        """``push`` of each id in turn: the newly completed text after each (possibly empty)."""
        step, tok, held = self._stream.step, self._tok, self._held
        texts: list[str] = []
        begin, emitted = 0, None  # start of the ids whose text is not complete; the last complete run
        for i, t in enumerate(token_ids):
            text = step(tok, t)
            if text is None:
                texts.append("")
            else:
                texts.append(text)
                emitted, begin = (begin, i + 1), i + 1
        if emitted is None:
            held.extend(token_ids)
        else:
            start, end = emitted
            self._last = [*(held if start == 0 else ()), *token_ids[start:end]][-_CONTEXT_IDS:]
            self._held = list(token_ids[end:])
        return texts

    def flush(self) -> str:
        """At the end of the stream: whatever is still held (an incomplete character decodes as U+FFFD,
        as a full decode would)."""
        if not self._held:
            return ""
        prefix_text = self._tok.decode(self._last, skip_special_tokens=self._skip)
        full_text = self._tok.decode(self._last + self._held, skip_special_tokens=self._skip)
        self._last, self._held = (self._last + self._held)[-_CONTEXT_IDS:], []
        return full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""


class WindowDetokenizer:
    """Streams text through any ``Decoder``: decodes the window of the last emitted ids with and without
    the new ones and emits the difference, holding back text that ends in U+FFFD."""

    def __init__(self, decoder: Decoder, context_ids: Sequence[int] = (), skip_special_tokens: bool = True):
        self._tok = decoder
        self._skip = skip_special_tokens
        self._ids: list[int] = list(context_ids[-_CONTEXT_IDS:])
        self._prefix = 0  # start of the decode window
        self._read = len(self._ids)  # ids before this are already emitted as text

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def push(self, token_ids: Sequence[int]) -> str:
        """Add ids; return the newly completed text (possibly empty)."""
        if not token_ids:
            return ""
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT):
            return ""  # nothing new yet, or a character still incomplete
        delta = full_text[len(prefix_text) :]
        self._prefix, self._read = self._read, len(self._ids)
        return delta

    def flush(self) -> str:
        """At the end of the stream: whatever is still held (an incomplete character decodes as U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""


class KeepSpecialDecoder:
    """Decodes like the preprocessor, but keeps the special tokens a parser needs (``<|channel|>``,
    ``<|python_tag|>``, ...) while still skipping every other special token."""

    def __init__(self, preprocessor: Any, keep: frozenset[str]) -> None:
        self._pre: Decoder = preprocessor
        added = preprocessor.tokenizer.get_added_tokens_decoder()
        self._drop = frozenset(i for i, t in added.items() if t.special and t.content not in keep)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._pre.decode([i for i in ids if i not in self._drop], skip_special_tokens=False)


class StopStringMatcher:
    def __init__(self, stop_strings: Sequence[str]):
        self._stops = [s for s in stop_strings if s]
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""

    @property
    def active(self) -> bool:
        """Whether there is any stop string to look for."""
        return bool(self._stops)

    def push(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit, whether a stop string was found). After a stop,
        everything from the stop string on is dropped."""
        if not self._stops:
            return text, False
        buf = self._held + text
        cut = min((i for i in (buf.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return buf[:cut], True
        hold = 0
        for k in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self._stops):
                hold = k
                break
        self._held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        """At the end of the stream without a stop: the held text was not a stop string after all."""
        held, self._held = self._held, ""
        return held


class Delta(NamedTuple):
    text: str
    token_count: int  # ids consumed from this chunk (up to and excluding a stop token id)
    stopped: bool  # a stop string or stop token id ended the output


class OutputText:
    """Detokenize, apply stop token ids and stop strings, chunk by chunk."""

    def __init__(
        self,
        tokenizer: Tokenizer | Decoder,
        *,
        prompt_ids: Sequence[int] = (),
        stop_strings: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
    ):
        self._detok: IncrementalDetokenizer | WindowDetokenizer = (
            IncrementalDetokenizer(tokenizer, prompt_ids)
            if isinstance(tokenizer, Tokenizer)
            else WindowDetokenizer(tokenizer, prompt_ids)
        )
        self._stops = StopStringMatcher(stop_strings)
        self._stop_ids = frozenset(stop_token_ids)
        self.stopped = False

    def push(self, token_ids: Sequence[int]) -> Delta:
        if self.stopped:
            return Delta("", 0, True)
        ids = list(token_ids)
        hit_stop_id = False
        if self._stop_ids:
            for i, t in enumerate(ids):
                if t in self._stop_ids:
                    ids, hit_stop_id = ids[:i], True
                    break
        text, stopped = self._stops.push(self._detok.push(ids))
        if hit_stop_id and not stopped:
            tail, stopped = self._stops.push(self._detok.flush())
            text += tail
            if not stopped:
                text += self._stops.flush()
            stopped = True
        self.stopped = stopped
        return Delta(text, len(ids), stopped)

    def push_each(self, token_ids: Sequence[int]) -> tuple[list[str], int, bool]:
        """``push`` of each id in turn, up to a stop: the text of each, the ids consumed, and whether
        it stopped. Without stop strings and stop ids in ``token_ids``, in one pass of the
        detokenizer (a call per id through ``push`` cost more than decoding the id)."""
        detok = self._detok
        if (
            not self.stopped
            and not self._stops.active
            and self._stop_ids.isdisjoint(token_ids)
            and isinstance(detok, IncrementalDetokenizer)
        ):
            return detok.push_each(token_ids), len(token_ids), False
        texts: list[str] = []
        count = 0
        for t in token_ids:
            delta = self.push((t,))
            texts.append(delta.text)
            count += delta.token_count
            if delta.stopped:
                return texts, count, True
        return texts, count, self.stopped

    def finish(self) -> str:
        """The stream ended without a stop: the text still held back."""
        if self.stopped:
            return ""
        text, stopped = self._stops.push(self._detok.flush())
        self.stopped = stopped
        return text if stopped else text + self._stops.flush()


# --- logprobs -------------------------------------------------------------------------------------


class Logprobs:
    """Worker logprobs as OpenAI's chat or completions shapes, collected until the next event."""

    def __init__(self, preprocessor: Decoder, chat: bool) -> None:
        self._pre = preprocessor
        self.chat = chat
        self.pending: list[tuple[str, WorkerLogprob]] = []
        self.offset = 0

    def _text(self, token_id: int) -> str:
        return self._pre.decode([token_id], skip_special_tokens=False)

    def _top(self, token_id: int, logprob: float) -> ChatTopLogprob:
        text = self._text(token_id)
        return ChatTopLogprob(token=text, logprob=logprob, bytes=list(text.encode()))

    def add(self, logprobs: Sequence[WorkerLogprob] | None, count: int) -> None:
        for lp in (logprobs or [])[:count]:
            self.pending.append((self._text(lp.token_id), lp))

    def take(self) -> ChatLogprobs | CompletionLogprobs | None:
        if not self.pending:
            return None
        items, self.pending = self.pending, []
        if self.chat:
            return ChatLogprobs(
                content=[
                    ChatTokenLogprob(
                        token=text,
                        logprob=lp.logprob,
                        bytes=list(text.encode()),
                        top_logprobs=[self._top(top.token_id, top.logprob) for top in lp.top],
                    )
                    for text, lp in items
                ]
            )
        offsets = []
        for text, _ in items:
            offsets.append(self.offset)
            self.offset += len(text)
        return CompletionLogprobs(
            tokens=[text for text, _ in items],
            token_logprobs=[lp.logprob for _, lp in items],
            top_logprobs=[{self._text(t.token_id): t.logprob for t in lp.top} for _, lp in items],
            text_offset=offsets,
        )


# --- bodies and events ----------------------------------------------------------------------------

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


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> CompletionUsage:
    return CompletionUsage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


def listed_model(
    name: str, created: int, *, root: str | None = None, parent: str | None = None
) -> ListedModel:
    """A model of ``/v1/models``; a LoRA adapter with ``root`` (its source) and ``parent`` (its model)."""
    return ListedModel(id=name, created=created, root=root, parent=parent)


def model_list(cards: list[ListedModel]) -> ModelList:
    return ModelList(data=cards)


def health(
    served: list[str], namespace: str, starting: Sequence[str] = (), loading: Sequence[str] = ()
) -> tuple[int, Health]:
    """(HTTP status, body) of ``/health``: healthy while some model is listed (served, or kept while it
    scales up: ``models.registry``) and none is ``loading`` its first model card from the workers that
    just registered, nor ``starting`` (its first prefill/decode pairs are being warmed up, bounded:
    ``serving.warmup``). Both would hold a user's first request."""
    if loading:
        reason = (
            f"loading the model card (tokenizer, chat template) of {', '.join(loading)} from its workers "
            "(bounded by --model-load-timeout-s)"
        )
        return 503, Health(status="unhealthy", models=served, reason=reason)
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
    use: CompletionUsage,
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

    def usage(self, use: CompletionUsage) -> bytes:
        """The last event before ``SSE_DONE`` when the client asked for usage: no choices, the counts."""
        h = self.head
        if h.kind == "chat":
            body: ChatCompletionChunk | Completion = ChatCompletionChunk(
                id=h.id, created=h.created, model=h.model, choices=[], usage=use
            )
        else:
            body = Completion(id=h.id, created=h.created, model=h.model, choices=[], usage=use)
        return sse(dump(body))
