"""Serving a request that uses features (``requests.features``): the same worker stream as plain
requests, shaped with reasoning, tool calls and logprobs.

The plain path (``serving.plain_run.PlainRun``) stays as it is; a job with a ``FeaturePlan`` comes here
instead. The text still goes through ``OutputText`` (incremental detokenization, stop strings), then
through ``AnswerStream`` for chat; logprobs come with the worker's chunks, one per token, and ride on
the next event sent (so a parser holding text back never separates a token from its logprob for
long). A chat answer that made tool calls ends with ``finish_reason`` ``tool_calls``.

Chunk shapes are OpenAI's: ``delta.reasoning_content`` (as SGLang and vLLM name it), ``delta.content``,
``delta.tool_calls[i]`` with ``index``, ``id``, ``type`` and ``function.name`` in a call's first delta
and ``function.arguments`` after it; ``choices[0].logprobs`` as ``{"content": [...]}`` for chat and
``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` for completions.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from dynamo_worker.frontend.errors import ApiError
from dynamo_worker.frontend.httpio import json_response, sse_response
from dynamo_worker.frontend.output import shaping
from dynamo_worker.frontend.output.chat_output import AnswerStream
from dynamo_worker.frontend.output.shaping import SSE_DONE, finish_reason, sse
from dynamo_worker.frontend.output.text import OutputText
from dynamo_worker.frontend.requests.job import prompt_tokens
from dynamo_worker.protocol import TokenLogprob

if TYPE_CHECKING:
    from dynamo_worker.frontend.metrics import FrontendMetrics
    from dynamo_worker.frontend.requests.features import FeaturePlan
    from dynamo_worker.frontend.requests.job import Job
    from dynamo_worker.frontend.serving.dispatch import Dispatch

log = logging.getLogger(__name__)

__all__ = ["KeepSpecialDecoder", "run_featured"]


class KeepSpecialDecoder:
    """Decodes like the preprocessor, but keeps the special tokens a parser needs (``<|channel|>``,
    ``<|python_tag|>``, ...) while still skipping every other special token."""

    def __init__(self, preprocessor: Any, keep: frozenset[str]) -> None:
        self._pre = preprocessor
        added = preprocessor.tokenizer.get_added_tokens_decoder()
        self._drop = frozenset(i for i, t in added.items() if t.special and t.content not in keep)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._pre.decode([i for i in ids if i not in self._drop], skip_special_tokens=False)


def _sse(body: dict[str, Any]) -> bytes:
    return sse(orjson.dumps(body))


class _Logprobs:
    """Worker logprobs as OpenAI's chat or completions shapes, collected until the next event."""

    def __init__(self, preprocessor: Any, chat: bool) -> None:
        self._pre = preprocessor
        self.chat = chat
        self.pending: list[tuple[str, TokenLogprob]] = []
        self.offset = 0

    def _text(self, token_id: int) -> str:
        return self._pre.decode([token_id], skip_special_tokens=False)

    def _top(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self._text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    def add(self, logprobs: Sequence[TokenLogprob] | None, count: int) -> None:
        for lp in (logprobs or [])[:count]:
            self.pending.append((self._text(lp.token_id), lp))

    def take(self) -> dict[str, Any] | None:
        if not self.pending:
            return None
        items, self.pending = self.pending, []
        if self.chat:
            return {
                "content": [
                    {
                        "token": text,
                        "logprob": lp.logprob,
                        "bytes": list(text.encode()),
                        "top_logprobs": [self._top(top.token_id, top.logprob) for top in lp.top],
                    }
                    for text, lp in items
                ]
            }
        offsets = []
        for text, _ in items:
            offsets.append(self.offset)
            self.offset += len(text)
        return {
            "tokens": [text for text, _ in items],
            "token_logprobs": [lp.logprob for _, lp in items],
            "top_logprobs": [{self._text(t.token_id): t.logprob for t in lp.top} for _, lp in items],
            "text_offset": offsets,
        }


async def run_featured(
    dispatcher: Dispatch,
    metrics: FrontendMetrics,
    http_request: web.Request,
    job: Job,
    plan: FeaturePlan,
    started: float,
) -> web.StreamResponse:
    pre = job.preprocessor
    chat = job.kind == "chat"
    answer = AnswerStream(plan.answer) if chat and plan.answer is not None else None
    keep = plan.answer.keep_special() if plan.answer is not None else frozenset()
    decoder = KeepSpecialDecoder(pre, keep) if keep else pre.tokenizer  # a Tokenizer streams faster
    out = OutputText(
        decoder, prompt_ids=job.prompt_ids, stop_strings=job.stop_strings, stop_token_ids=job.stop_token_ids
    )
    logprobs = _Logprobs(pre, chat) if plan.logprobs is not None else None
    ttft, itl = metrics.ttft.labels(job.model), metrics.itl.labels(job.model)
    metrics.input_tokens.labels(job.model).inc(len(job.prompt_ids))
    base = {"id": job.id, "created": job.created, "model": job.model}
    obj = "chat.completion.chunk" if chat else "text_completion"
    response: web.StreamResponse | None = None
    completion_tokens = cached_tokens = 0
    prompt_count = len(job.prompt_ids)  # the worker's count for a request with images (job.prompt_tokens)
    finish: str | None = None
    text_parts: list[str] = []
    last_token_at: float | None = None

    def chunk(
        delta: dict[str, Any] | None, text: str = "", reason: str | None = None, with_logprobs: bool = True
    ) -> bytes:
        lp = logprobs.take() if logprobs is not None and with_logprobs else None
        if chat:
            choice = {"index": 0, "delta": delta or {}, "logprobs": lp, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": reason}
        body = base | {"object": obj, "choices": [choice]}
        if job.include_usage:
            body["usage"] = None
        return _sse(body)

    async def emit(text: str, final: bool = False) -> None:
        nonlocal response
        if not job.stream:
            text_parts.append(text)
            return
        events: list[bytes] = []
        if response is None:
            response = await sse_response(http_request)
            if chat:
                events.append(chunk({"role": "assistant", "content": ""}, with_logprobs=False))
        if answer is not None:
            events += [chunk(d) for d in (answer.finish() if final else answer.push(text))]
        elif text:
            events.append(chunk({"content": text}) if chat else chunk(None, text))
        if not final and logprobs is not None and logprobs.pending:
            events.append(chunk({}) if chat else chunk(None, ""))
        if events:
            await response.write(b"".join(events))

    try:
        async with contextlib.aclosing(dispatcher.generate(job.entry, job.generate)) as chunks:
            async for c in chunks:
                if c.token_ids:
                    now = time.monotonic()
                    if last_token_at is None:
                        ttft.observe(now - started)
                    else:
                        itl.observe(now - last_token_at)
                    last_token_at = now
                    delta = out.push(c.token_ids)
                    completion_tokens += delta.token_count
                    if logprobs is not None:
                        logprobs.add(c.logprobs, delta.token_count)
                    if delta.stopped:
                        finish = "stop"
                        await emit(delta.text)
                        break
                    if delta.text:
                        await emit(delta.text)
                if c.finish_reason is not None:
                    finish = finish_reason(c.finish_reason)
                    prompt_count = prompt_tokens(job, c.usage)
                    if c.usage is not None:
                        cached_tokens = min(c.usage.cached_tokens, prompt_count)
                    await emit(out.finish())
                    break
    except ApiError as e:
        if response is None:
            raise
        metrics.errors.labels(e.code or e.type).inc()
        log.warning("Stream failed after it started status=%d code=%s msg=%s", e.status, e.code, e.message)
        await response.write_eof(_sse(e.body()))
        return response
    except ConnectionResetError:
        metrics.errors.labels("client_disconnected").inc()
        assert response is not None
        return response
    metrics.output_tokens.labels(job.model).inc(completion_tokens)
    metrics.cached_tokens.labels(job.model).inc(cached_tokens)
    usage = shaping.usage(prompt_count, completion_tokens, cached_tokens).model_dump()
    reason = finish or "stop"
    if not job.stream:
        text = "".join(text_parts)
        lp = logprobs.take() if logprobs is not None else None
        if not chat:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": reason}
            return _json(base | {"object": "text_completion", "choices": [choice], "usage": usage})
        if answer is not None:
            answer.push(text)
            answer.finish()
            message = answer.message()
            if answer.calls and reason == "stop":
                reason = "tool_calls"
        else:
            message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "logprobs": lp, "finish_reason": reason}
        return _json(base | {"object": "chat.completion", "choices": [choice], "usage": usage})
    await emit("", final=True)
    assert response is not None
    if answer is not None and answer.calls and reason == "stop":
        reason = "tool_calls"
    tail = [chunk({}, reason=reason) if chat else chunk(None, "", reason)]
    if job.include_usage:
        tail.append(_sse(base | {"object": obj, "choices": [], "usage": usage}))
    tail.append(SSE_DONE)
    await response.write_eof(b"".join(tail))
    return response


def _json(body: dict[str, Any]) -> web.Response:
    return json_response(orjson.dumps(body))
