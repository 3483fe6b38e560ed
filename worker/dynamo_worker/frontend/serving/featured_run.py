"""Serving a request that uses features (``requests.features``): the same worker stream as plain
requests, shaped with reasoning, tool calls and logprobs.

The plain path (``serving.plain_run.PlainRun``) stays as it is; a job with a ``FeaturePlan`` comes here
instead. The text still goes through ``OutputText`` (incremental detokenization, stop strings), then
through ``AnswerStream`` for chat; logprobs come with the worker's chunks, one per token, and ride on
the next event sent (``output.logprobs``). A chat answer that made tool calls ends with
``finish_reason`` ``tool_calls``.

Chunk shapes are OpenAI's: ``delta.reasoning_content`` (as SGLang and vLLM name it), ``delta.content``,
``delta.tool_calls[i]`` with ``index``, ``id``, ``type`` and ``function.name`` in a call's first delta
and ``function.arguments`` after it; ``choices[0].logprobs`` as ``{"content": [...]}`` for chat and
``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` for completions.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from dynamo_worker.frontend.errors import ApiError
from dynamo_worker.frontend.httpio import json_response, sse_response
from dynamo_worker.frontend.output import shaping
from dynamo_worker.frontend.output.chat_output import AnswerStream
from dynamo_worker.frontend.output.logprobs import Logprobs
from dynamo_worker.frontend.output.shaping import SSE_DONE, finish_reason, sse
from dynamo_worker.frontend.output.text import KeepSpecialDecoder, OutputText
from dynamo_worker.frontend.requests.job import prompt_tokens
from dynamo_worker.protocol import GenerateChunk

if TYPE_CHECKING:
    from dynamo_worker.frontend.metrics import FrontendMetrics
    from dynamo_worker.frontend.requests.features import FeaturePlan
    from dynamo_worker.frontend.requests.job import Job
    from dynamo_worker.frontend.serving.dispatch import Dispatch

log = logging.getLogger(__name__)

__all__ = ["FeaturedRun"]


def _sse(body: dict[str, Any]) -> bytes:
    return sse(orjson.dumps(body))


def _json(body: dict[str, Any]) -> web.Response:
    return json_response(orjson.dumps(body))


class FeaturedRun:
    """One job with a ``FeaturePlan``, from the worker's first chunk to the client's last byte."""

    def __init__(
        self,
        dispatcher: Dispatch,
        metrics: FrontendMetrics,
        http_request: web.Request,
        job: Job,
        plan: FeaturePlan,
        started: float,
    ) -> None:
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.ttft, self.itl = metrics.ttft.labels(job.model), metrics.itl.labels(job.model)
        self.http_request = http_request
        self.job = job
        self.started = started
        pre = job.preprocessor
        self.chat = job.kind == "chat"
        self.answer = AnswerStream(plan.answer) if self.chat and plan.answer is not None else None
        keep = plan.answer.keep_special() if plan.answer is not None else frozenset()
        decoder = KeepSpecialDecoder(pre, keep) if keep else pre.tokenizer  # a Tokenizer streams faster
        self.out = OutputText(
            decoder,
            prompt_ids=job.prompt_ids,
            stop_strings=job.stop_strings,
            stop_token_ids=job.stop_token_ids,
        )
        self.logprobs = Logprobs(pre, self.chat) if plan.logprobs is not None else None
        self.base = {"id": job.id, "created": job.created, "model": job.model}
        self.object = "chat.completion.chunk" if self.chat else "text_completion"
        self.response: web.StreamResponse | None = None
        self.completion_tokens = self.cached_tokens = self.cached_tokens_host = 0
        self.prompt_tokens = len(job.prompt_ids)  # the worker's count for a request with images
        self.finish: str | None = None
        self.texts: list[str] = []  # not streamed: the answer so far
        self.last_token_at: float | None = None

    async def run(self) -> web.StreamResponse:
        """Serve the job; raises ``ApiError`` only before the stream started."""
        job, metrics = self.job, self.metrics
        metrics.input_tokens.labels(job.model).inc(len(job.prompt_ids))
        try:
            await self._generate()
        except ApiError as e:
            if self.response is None:
                raise
            metrics.errors.labels(e.code or e.type).inc()
            log.warning(
                "Stream failed after it started status=%d code=%s msg=%s", e.status, e.code, e.message
            )
            await self.response.write_eof(_sse(e.body()))
            return self.response
        except ConnectionResetError:
            metrics.errors.labels("client_disconnected").inc()
            assert self.response is not None
            return self.response
        metrics.output_tokens.labels(job.model).inc(self.completion_tokens)
        metrics.cached_tokens.labels(job.model).inc(self.cached_tokens)
        metrics.cached_tokens_host.labels(job.model).inc(self.cached_tokens_host)
        usage = shaping.usage(self.prompt_tokens, self.completion_tokens, self.cached_tokens).model_dump()
        if not job.stream:
            return self._whole(usage)
        return await self._end(usage)

    # --- the worker's stream --------------------------------------------------------------------

    async def _generate(self) -> None:
        job = self.job
        async with contextlib.aclosing(self.dispatcher.generate(job.entry, job.generate)) as chunks:
            async for chunk in chunks:
                if chunk.token_ids and await self._tokens(chunk):
                    return
                if chunk.finish_reason is not None:
                    await self._finished(chunk)
                    return

    async def _tokens(self, chunk: GenerateChunk) -> bool:
        """Pass on a chunk's tokens; True when they hit a stop string or token."""
        now, last = time.monotonic(), self.last_token_at
        if last is None:
            self.ttft.observe(now - self.started)
        else:
            self.itl.observe(now - last)
        self.last_token_at = now
        delta = self.out.push(chunk.token_ids)
        self.completion_tokens += delta.token_count
        if self.logprobs is not None:
            self.logprobs.add(chunk.logprobs, delta.token_count)
        if delta.stopped:
            self.finish = "stop"
        if delta.text or delta.stopped:
            await self._emit(delta.text)
        return delta.stopped

    async def _finished(self, chunk: GenerateChunk) -> None:
        """The worker's last chunk: its finish reason and usage, and the text held back until now."""
        assert chunk.finish_reason is not None
        self.finish = finish_reason(chunk.finish_reason)
        self.prompt_tokens = prompt_tokens(self.job, chunk.usage)
        if chunk.usage is not None:
            self.cached_tokens = min(chunk.usage.cached_tokens, self.prompt_tokens)
            self.cached_tokens_host = min(chunk.usage.cached_tokens_host, self.cached_tokens)
        await self._emit(self.out.finish())

    # --- to the client --------------------------------------------------------------------------

    def _chunk(
        self, delta: dict[str, Any], text: str = "", reason: str | None = None, with_logprobs: bool = True
    ) -> bytes:
        """One SSE event: ``delta`` for chat, ``text`` for completions."""
        lp = self.logprobs.take() if self.logprobs is not None and with_logprobs else None
        if self.chat:
            choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": reason}
        body = self.base | {"object": self.object, "choices": [choice]}
        if self.job.include_usage:
            body["usage"] = None
        return _sse(body)

    async def _emit(self, text: str, final: bool = False) -> None:
        """Stream ``text`` (``final``: and what the answer parser still holds); not streamed, keep it."""
        if not self.job.stream:
            self.texts.append(text)
            return
        events = await self._start() if self.response is None else []
        events += self._text_events(text, final)
        if not final and self.logprobs is not None and self.logprobs.pending:
            events.append(self._chunk({}))  # the logprobs of tokens whose text is held back
        if events:
            assert self.response is not None
            await self.response.write(b"".join(events))

    async def _start(self) -> list[bytes]:
        """Start the SSE response; its first event (chat: the assistant's role)."""
        self.response = await sse_response(self.http_request)
        return [self._chunk({"role": "assistant", "content": ""}, with_logprobs=False)] if self.chat else []

    def _text_events(self, text: str, final: bool) -> list[bytes]:
        if self.answer is not None:
            return [self._chunk(d) for d in (self.answer.finish() if final else self.answer.push(text))]
        return [self._chunk({"content": text}, text)] if text else []

    def _reason(self) -> str:
        """The finish reason to send: ``tool_calls`` for a chat answer that called tools and stopped."""
        reason = self.finish or "stop"
        return "tool_calls" if self.answer is not None and self.answer.calls and reason == "stop" else reason

    def _whole(self, usage: dict[str, Any]) -> web.Response:
        """The answer not streamed: one JSON body."""
        text = "".join(self.texts)
        lp = self.logprobs.take() if self.logprobs is not None else None
        if not self.chat:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": self.finish or "stop"}
            return _json(self.base | {"object": "text_completion", "choices": [choice], "usage": usage})
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.answer is not None:
            self.answer.push(text)
            self.answer.finish()
            message = self.answer.message()
        choice = {"index": 0, "message": message, "logprobs": lp, "finish_reason": self._reason()}
        return _json(self.base | {"object": "chat.completion", "choices": [choice], "usage": usage})

    async def _end(self, usage: dict[str, Any]) -> web.StreamResponse:
        """The stream's tail: what the parser held, the finish reason, the usage (when asked), [DONE]."""
        await self._emit("", final=True)
        assert self.response is not None
        tail = [self._chunk({}, reason=self._reason())]
        if self.job.include_usage:
            tail.append(_sse(self.base | {"object": self.object, "choices": [], "usage": usage}))
        tail.append(SSE_DONE)
        await self.response.write_eof(b"".join(tail))
        return self.response
