"""A job's answer over HTTP: the worker's stream through detokenization and stop handling to the client,
whole (JSON) or as SSE; an embedding job's vectors; and the JSON, SSE and error responses every
endpoint sends.

``Run`` is what every chat or completion job's run does: relay the worker's chunks, time them (TTFT,
ITL), take the finish reason and usage from the last one, count the tokens, and handle errors and a
client that went away. What the text becomes is a subclass's: ``PlainRun`` (no tools, reasoning,
structured output or logprobs: the byte splice of ``output.shaping.StreamEvents``, the fast path) and
``FeaturedRun`` (a job with a ``FeaturePlan``, ``requests.chat``: its answer shaped with reasoning,
tool calls and logprobs). Every body is shaped in ``output``.

``FeaturedRun``'s text still goes through ``OutputText`` (incremental detokenization, stop strings),
then through ``AnswerStream`` for chat; logprobs come with the worker's chunks, one per token, and ride
on the next event sent (``output.shaping.Logprobs``). A chat answer that made tool calls ends with
``finish_reason`` ``tool_calls``. The chunks are OpenAI's (``protocol``): ``delta.reasoning_content``
(as SGLang and vLLM name it), ``delta.content``, ``delta.tool_calls[i]``, and ``choices[0].logprobs``.

Streaming responses start only when the first output arrives, so a failure before it (no worker,
worker unreachable, overload) is an ordinary HTTP error status. A failure after it is sent as a final
SSE event ``data: {"error": {...}}`` (the ``openai`` client raises it) without ``data: [DONE]``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from dynamo_worker.frontend.errors import ApiError
from dynamo_worker.frontend.metrics import Tally
from dynamo_worker.frontend.output.chat_output import AnswerStream
from dynamo_worker.frontend.output.shaping import (
    SSE_DONE,
    Decoder,
    Head,
    KeepSpecialDecoder,
    Logprobs,
    OutputText,
    StreamEvents,
    finish_reason,
    sse,
    usage,
    whole,
)
from dynamo_worker.frontend.protocol import (
    ChatCompletion,
    ChatDelta,
    Completion,
    CompletionUsage,
    Embedding,
    EmbeddingList,
    EmbeddingUsage,
    FinishReason,
    dump,
)
from dynamo_worker.frontend.requests.job import EmbeddingPlan, FeaturePlan, prompt_tokens
from dynamo_worker.protocol import unpack_vector

if TYPE_CHECKING:
    from dynamo_worker.frontend.metrics import FrontendMetrics
    from dynamo_worker.frontend.requests.job import Job
    from dynamo_worker.frontend.serving.dispatch import ChunkSource
    from dynamo_worker.frontend.serving.embedding_batcher import EmbeddingBatcher
    from dynamo_worker.protocol import GenerateChunk

log = logging.getLogger(__name__)

__all__ = [
    "FeaturedRun",
    "PlainRun",
    "Run",
    "error_response",
    "json_response",
    "run_embedding",
    "sse_response",
]


# --- responses ------------------------------------------------------------------------------------


def json_response(body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON response from rendered ``body`` bytes (``protocol.dump``)."""
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


def error_response(error: ApiError) -> web.Response:
    return json_response(orjson.dumps(error.body()), status=error.status, headers=error.headers or None)


async def sse_response(http_request: web.Request) -> web.StreamResponse:
    """A started ``text/event-stream`` response."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(http_request)
    return response


# --- chat and completion jobs ----------------------------------------------------------------------


class Run:
    """One job from the worker's first chunk to the client's last byte. A subclass turns a chunk's
    tokens into text (``_decode``), the text into events or the whole answer (``emit``), and ends the
    stream (``_close``) or shapes the whole body (``_whole``)."""

    __slots__ = (
        "cached_tokens",
        "cached_tokens_host",
        "completion_tokens",
        "dispatcher",
        "events",
        "finish",
        "head",
        "http_request",
        "itl",
        "job",
        "last_token_at",
        "metrics",
        "out",
        "pending",
        "prompt_tokens",
        "response",
        "started",
        "texts",
        "ttft",
    )

    def __init__(
        self,
        dispatcher: ChunkSource,
        metrics: FrontendMetrics,
        http_request: web.Request,
        job: Job,
        started: float,
        decoder: Decoder | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.metrics = metrics
        per_model = metrics.of(job.model)
        self.ttft, self.itl = per_model.ttft, Tally(per_model.itl)
        self.http_request = http_request
        self.job = job
        self.started = started
        self.out = OutputText(
            job.preprocessor.tokenizer if decoder is None else decoder,  # a Tokenizer streams faster
            prompt_ids=job.prompt_ids,
            stop_strings=job.stop_strings,
            stop_token_ids=job.stop_token_ids,
        )
        self.head = Head(job.kind, job.id, job.created, job.model, job.include_usage)
        self.events = StreamEvents(self.head) if job.stream else None
        self.response: web.StreamResponse | None = None
        self.completion_tokens = self.cached_tokens = self.cached_tokens_host = 0
        self.prompt_tokens = len(job.prompt_ids)  # the worker's count for a request with images
        self.finish: FinishReason | None = None
        self.texts: list[str] = []  # not streamed: the answer so far
        self.last_token_at: float | None = None
        # SSE events not sent yet: the stream's tail waits for its end, so it leaves in one write.
        self.pending: list[bytes] = []

    # --- what a subclass does -------------------------------------------------------------------

    def _decode(self, chunk: GenerateChunk) -> list[str]:
        """The text of the chunk's tokens, in the parts ``emit`` takes; sets ``finish`` at a stop string
        or token."""
        raise NotImplementedError

    async def emit(self, *parts: str) -> None:
        """Send the parts' events (streamed) or keep their text (not streamed)."""
        raise NotImplementedError

    async def _close(self, events: StreamEvents) -> None:
        """Start the response if nothing did, and put the events up to the finish reason in
        ``pending``."""
        raise NotImplementedError

    def _whole(self, use: CompletionUsage) -> ChatCompletion | Completion:
        """The answer not streamed."""
        raise NotImplementedError

    # --- the run --------------------------------------------------------------------------------

    async def start(self, events: StreamEvents) -> web.StreamResponse:
        """Start the SSE response; a chat's first event (the assistant's role) goes with the next write."""
        self.response = response = await sse_response(self.http_request)
        if self.job.kind == "chat":
            self.pending.append(events.role())
        return response

    async def _generate(self) -> None:
        """Relay the worker's chunks (a coroutine per chunk would cost more than the chunk's event)."""
        try:
            await self._relay()
        finally:
            self.itl.flush()

    async def _relay(self) -> None:
        job = self.job
        async with contextlib.aclosing(self.dispatcher.generate(job.entry, job.generate)) as chunks:
            async for chunk in chunks:
                if chunk.token_ids:
                    now, last = time.monotonic(), self.last_token_at
                    if last is None:
                        self.ttft.observe(now - self.started)
                    else:  # per token: a chunk of k tokens (a batched hand-over) is k gaps of 1/k
                        self.itl.observe((now - last) / len(chunk.token_ids), len(chunk.token_ids))
                    self.last_token_at = now
                    parts = self._decode(chunk)
                    if self.finish is not None:  # a stop string or token
                        await self.emit(*parts)
                        return
                    if any(parts):
                        await self.emit(*parts)
                if chunk.finish_reason is not None:
                    self.finish = finish_reason(chunk.finish_reason)
                    self.prompt_tokens = prompt_tokens(job, chunk.usage)
                    if chunk.usage is not None:
                        self.cached_tokens = min(chunk.usage.cached_tokens, self.prompt_tokens)
                        self.cached_tokens_host = min(chunk.usage.cached_tokens_host, self.cached_tokens)
                    await self.emit(self.out.finish())
                    return

    async def run(self) -> web.StreamResponse:
        """Serve the job; raises ``ApiError`` only before the stream started."""
        job, metrics = self.job, self.metrics
        per_model = metrics.of(job.model)
        per_model.input_tokens.inc(len(job.prompt_ids))
        try:
            await self._generate()
        except ApiError as e:
            if self.response is None:
                raise
            metrics.errors.labels(e.code or e.type).inc()
            log.warning(
                "Stream failed after it started status=%d code=%s message=%s", e.status, e.code, e.message
            )
            await self.response.write_eof(b"".join(self.pending) + sse(orjson.dumps(e.body())))
            return self.response
        except ConnectionResetError:
            metrics.errors.labels("client_disconnected").inc()
            log.info("Client went away request_id=%s", job.generate.request_id)
            assert self.response is not None
            return self.response
        per_model.output_tokens.inc(self.completion_tokens)
        per_model.cached_tokens.inc(self.cached_tokens)
        per_model.cached_tokens_host.inc(self.cached_tokens_host)
        use = usage(self.prompt_tokens, self.completion_tokens, self.cached_tokens)
        if self.events is None:
            return json_response(dump(self._whole(use)))
        await self._close(self.events)
        assert self.response is not None
        if job.include_usage:
            self.pending.append(self.events.usage(use))
        self.pending.append(SSE_DONE)
        await self.response.write_eof(b"".join(self.pending))
        return self.response


class PlainRun(Run):
    """A job without features. Streamed, every token is an event of its own, also when several arrived
    at once (the worker or the request plane coalesced them because a reader fell behind); those events
    then leave in one write."""

    __slots__ = ("one_by_one",)

    def __init__(
        self,
        dispatcher: ChunkSource,
        metrics: FrontendMetrics,
        http_request: web.Request,
        job: Job,
        started: float,
    ) -> None:
        super().__init__(dispatcher, metrics, http_request, job, started)
        self.one_by_one = not job.reads_whole  # a chunk of several tokens, token by token

    def _decode(self, chunk: GenerateChunk) -> list[str]:
        """The text of each token (of all at once, when neither streamed nor stopped by strings). Token
        by token, a stop string also ends the count of completion tokens at the token holding it."""
        if self.one_by_one:
            parts, count, stopped = self.out.push_each(chunk.token_ids)
        else:
            delta = self.out.push(chunk.token_ids)
            parts, count, stopped = [delta.text], delta.token_count, delta.stopped
        self.completion_tokens += count
        if stopped:
            self.finish = "stop"
        return parts

    async def emit(self, *parts: str) -> None:
        """One event per part (the last one carries the finish reason, once there is one), sent in one
        write; the events after the finish reason wait for the end of the stream."""
        events = self.events
        if events is None:
            self.texts.extend(parts)
            return
        response = self.response
        if response is None:
            response = await self.start(events)
        pending, finish = self.pending, self.finish
        if finish is None and len(parts) == 1 and not pending:  # the usual event: one token's text
            if parts[0]:
                await response.write(events.text(parts[0]))
            return
        for text in parts if finish is None else parts[:-1]:
            if text:
                pending.append(events.text(text))
        if finish is not None:
            pending.append(events.final(parts[-1], finish))
        elif pending:
            await response.write(b"".join(pending))
            pending.clear()

    async def _close(self, events: StreamEvents) -> None:
        if self.response is None:  # finished without any output: still a valid (empty) stream
            await self.emit("")

    def _whole(self, use: CompletionUsage) -> ChatCompletion | Completion:
        return whole(self.head, "".join(self.texts), self.finish or "stop", use)


class FeaturedRun(Run):
    """A job with a ``FeaturePlan``: one event per chunk, parsed into reasoning, content and tool calls
    (chat), with the logprobs of its tokens."""

    __slots__ = ("answer", "chat", "logprobs")

    def __init__(
        self,
        dispatcher: ChunkSource,
        metrics: FrontendMetrics,
        http_request: web.Request,
        job: Job,
        started: float,
    ) -> None:
        plan = job.plan
        assert isinstance(plan, FeaturePlan)
        pre = job.preprocessor
        keep = plan.answer.keep_special() if plan.answer is not None else frozenset()
        decoder = KeepSpecialDecoder(pre, keep) if keep else None
        super().__init__(dispatcher, metrics, http_request, job, started, decoder)
        self.chat = job.kind == "chat"
        self.answer = AnswerStream(plan.answer) if self.chat and plan.answer is not None else None
        self.logprobs = Logprobs(pre, self.chat) if plan.logprobs is not None else None

    def _decode(self, chunk: GenerateChunk) -> list[str]:
        delta = self.out.push(chunk.token_ids)
        self.completion_tokens += delta.token_count
        if self.logprobs is not None:
            self.logprobs.add(chunk.logprobs, delta.token_count)
        if delta.stopped:
            self.finish = "stop"
        return [delta.text]

    async def emit(self, *parts: str) -> None:
        text = "".join(parts)
        events = self.events
        if events is None:
            self.texts.append(text)
            return
        response = self.response
        if response is None:
            response = await self.start(events)
        out = self.pending
        out += self._text_events(events, text, final=False)
        if self.logprobs is not None and self.logprobs.pending:  # of tokens whose text is held back
            out.append(self._event(events, self._empty()))
        if out:
            await response.write(b"".join(out))
            out.clear()

    async def _close(self, events: StreamEvents) -> None:
        """What the answer parser still holds, and the finish reason."""
        if self.response is None:
            await self.start(events)
        self.pending += self._text_events(events, "", final=True)
        self.pending.append(self._event(events, self._empty(), self._reason()))

    def _whole(self, use: CompletionUsage) -> ChatCompletion | Completion:
        text = "".join(self.texts)
        logprobs = self.logprobs.take() if self.logprobs is not None else None
        message = None
        if self.answer is not None:
            self.answer.push(text)
            self.answer.finish()
            message = self.answer.message()
        return whole(self.head, text, self._reason(), use, message=message, logprobs=logprobs)

    # --- events ---------------------------------------------------------------------------------

    def _empty(self) -> ChatDelta | str:
        return ChatDelta() if self.chat else ""

    def _event(
        self, events: StreamEvents, delta: ChatDelta | str, finish: FinishReason | None = None
    ) -> bytes:
        """An event with ``delta`` and the logprobs of the tokens not sent yet."""
        return events.event(delta, self.logprobs.take() if self.logprobs is not None else None, finish)

    def _text_events(self, events: StreamEvents, text: str, final: bool) -> list[bytes]:
        if self.answer is not None:
            deltas = self.answer.finish() if final else self.answer.push(text)
            return [self._event(events, d) for d in deltas]
        return [self._event(events, ChatDelta(content=text) if self.chat else text)] if text else []

    def _reason(self) -> FinishReason:
        """The finish reason to send: ``tool_calls`` for a chat answer that called tools and stopped."""
        reason = self.finish or "stop"
        return "tool_calls" if self.answer is not None and self.answer.calls and reason == "stop" else reason


# --- embedding jobs -------------------------------------------------------------------------------


async def run_embedding(
    batcher: EmbeddingBatcher, metrics: FrontendMetrics, job: Job, plan: EmbeddingPlan
) -> web.Response:
    """The job's vectors, from ``batcher``, as one JSON answer."""
    assert job.generate.embed is not None
    vectors = await batcher.embed(job.entry, job.generate)
    tokens = sum(len(i) for i in job.generate.embed.inputs)
    metrics.of(job.model).input_tokens.inc(tokens)
    body = EmbeddingList(
        data=[Embedding(index=i, embedding=_encode(v, plan.encoding_format)) for i, v in enumerate(vectors)],
        model=job.model,
        usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens),
    )
    return json_response(dump(body))


def _encode(packed: str, encoding_format: str) -> list[float] | str:
    """The wire already carries OpenAI's base64 form; ``float`` unpacks it."""
    return packed if encoding_format == "base64" else unpack_vector(packed)
