"""The OpenAI HTTP API (aiohttp): request handling from JSON body to streamed or whole response.

Per request: parse and validate (400 naming the field), look the model up (404 unknown, 503 nobody
serving it), tokenize (chat template for chat), check the context length, then stream chunks from
the dispatcher through detokenization and stop handling to the client.

Streaming responses start only when the first output arrives, so a failure before it (no worker,
worker unreachable, overload) is an ordinary HTTP error status. A failure after it is sent as a final
SSE event ``data: {"error": {...}}`` (the ``openai`` client raises it) without ``data: [DONE]``.
A client that goes away cancels the handler (``handler_cancellation``), which closes the worker
streams, which cancels the request on the workers.

Requests that use tools, reasoning, structured output or logprobs (``features``: a ``FeaturePlan``
on the job) run through ``featured_run``, embeddings through ``embeddings``; plain requests never
leave the path below.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dynamo_worker.frontend.dispatch import Dispatcher
from dynamo_worker.frontend.embeddings import EmbeddingBatcher, EmbeddingPlan, prepare_embeddings
from dynamo_worker.frontend.errors import (
    ApiError,
    InvalidRequest,
    ModelNotFound,
    RequestTimeout,
    ServiceUnavailable,
    UpstreamError,
)
from dynamo_worker.frontend.features import FeaturePlan, chat_messages, plan_chat, plan_completion, serving
from dynamo_worker.frontend.images import ImagesApi
from dynamo_worker.frontend.metrics import FrontendMetrics
from dynamo_worker.frontend.multimodal import MultimodalProcessor, has_images
from dynamo_worker.frontend.openai_models import ChatCompletionRequest, CompletionRequest, parse_request
from dynamo_worker.frontend.preprocess import Preprocessor
from dynamo_worker.frontend.registry import ModelEntry, ModelRegistry
from dynamo_worker.frontend.text import OutputText
from dynamo_worker.protocol import GenerateRequest, SamplingOptions, StopConditions

log = logging.getLogger(__name__)

__all__ = ["OpenAIServer"]

MAX_BODY_BYTES = 32 * 1024 * 1024
# Prompts at least this long (characters) are tokenized in a thread: a few milliseconds of tokenizing
# would otherwise stall every stream this frontend relays. Shorter ones cost less than the hop.
THREAD_TOKENIZE_CHARS = 4096
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# A client that sends its body this slowly holds an in-flight slot; past the bound it gets a 408.
BODY_READ_TIMEOUT_S = 30.0
# Worker finish reasons as OpenAI's. "error" chunks never get here (the dispatcher raises them), and a
# "cancelled" one is an error too: the output was cut short, which "stop" would hide from the client.
_FINISH = {"stop": "stop", "length": "length"}


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def _error_response(error: ApiError) -> web.Response:
    return _json(error.body(), status=error.status, headers=error.headers or None)


@web.middleware
async def _openai_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every answer is OpenAI-shaped: unknown paths and methods too, and (logged) bugs as a 500."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        message = f"{e.reason}: {request.method} {request.path}"
        if e.status == 413:
            message += f"; the request body may be at most {MAX_BODY_BYTES // 2**20} MiB, send a shorter one"
        error = ApiError(message, code=str(e.status))
        error.type = "invalid_request_error" if e.status < 500 else "internal_error"
        return _json(error.body(), status=e.status)
    except Exception:  # a bug: map it to OpenAI's shape and log it, never leak a traceback
        log.exception("Unhandled error method=%s path=%s", request.method, request.path)
        error = ApiError("Internal error in the frontend; see its log.", code="internal_error")
        return _json(error.body(), status=500)


async def _tokenize(chars: int, encode: Callable[..., list[int]], *args: Any) -> list[int]:
    """``encode(*args)``, in a thread when the text is ``chars`` >= ``THREAD_TOKENIZE_CHARS`` long."""
    if chars < THREAD_TOKENIZE_CHARS:
        return encode(*args)
    return await asyncio.to_thread(encode, *args)


@dataclass
class _Job:
    """One request after validation: what to generate and how to shape the answer."""

    kind: str  # "chat" | "completion"
    model: str
    entry: ModelEntry
    preprocessor: Preprocessor
    prompt_ids: list[int]
    generate: GenerateRequest
    stop_strings: list[str]
    stop_token_ids: list[int]
    stream: bool
    include_usage: bool
    id: str
    created: int = field(default_factory=lambda: int(time.time()))
    plan: FeaturePlan | EmbeddingPlan | None = None  # tools, reasoning, logprobs, ...; embeddings


class OpenAIServer:
    def __init__(
        self,
        registry: ModelRegistry,
        dispatcher: Dispatcher,
        metrics: FrontendMetrics,
        *,
        max_inflight: int,
        embedding_batch_window_s: float = 0.002,
        multimodal: MultimodalProcessor | None = None,
        images: ImagesApi | None = None,
    ) -> None:
        self.multimodal = multimodal
        self.images = images
        self.registry = registry
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.max_inflight = max_inflight
        self.body_read_timeout_s = BODY_READ_TIMEOUT_S
        self.inflight = 0
        self.idle = asyncio.Event()  # set while no request is in flight
        self.idle.set()
        self.embedder = EmbeddingBatcher(dispatcher, window_s=embedding_batch_window_s)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_openai_errors])
        app.router.add_post("/v1/chat/completions", self._endpoint("chat", self._chat))
        app.router.add_post("/v1/completions", self._endpoint("completion", self._completion))
        app.router.add_post("/v1/embeddings", self._endpoint("embedding", self._embeddings))
        app.router.add_post("/v1/images/generations", self._image_generations)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model:.+}", self._model)
        app.router.add_get("/health", self._health)
        app.router.add_get("/live", self._live)
        app.router.add_get("/metrics", self._metrics)
        return app

    # --- small endpoints ----------------------------------------------------------------------

    def _model_card(self, name: str) -> dict[str, Any]:
        entry = self.registry.get(name)
        created = entry.created if entry is not None else 0
        return {"id": name, "object": "model", "created": created, "owned_by": "dynamo"}

    async def _models(self, _: web.Request) -> web.Response:
        return _json({"object": "list", "data": [self._model_card(m) for m in self.registry.served()]})

    async def _model(self, request: web.Request) -> web.Response:
        name, served = request.match_info["model"], self.registry.served()
        if name not in served:
            return _error_response(ModelNotFound(name, served))
        return _json(self._model_card(name))

    async def _health(self, _: web.Request) -> web.Response:
        served = self.registry.served()
        if served:
            return _json({"status": "healthy", "models": served})
        return _json(
            {
                "status": "unhealthy",
                "models": [],
                "reason": "no model can be served yet: no aggregated worker, or prefill and decode pair, "
                f"with a loaded model card in namespace '{self.registry.namespace}'",
            },
            status=503,
        )

    async def _live(self, _: web.Request) -> web.Response:
        return _json({"status": "live"})

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def _image_generations(self, http_request: web.Request) -> web.Response:
        if self.images is None:
            return self._fail(
                "images", "", InvalidRequest("This frontend generates no images.", code="unsupported")
            )
        self.inflight += 1
        self.idle.clear()
        try:
            body = await self._read_body(http_request)
            response = await self.images.generate(body)
        except ApiError as e:
            return self._fail("images", "", e)
        finally:
            self.inflight -= 1
            if not self.inflight:
                self.idle.set()
        self.metrics.requests.labels("", "images", "200").inc()
        return _json({"created": response["created"], "data": response["data"]})

    # --- generation endpoints -----------------------------------------------------------------

    def _endpoint(
        self, name: str, prepare: Callable[[bytes], Awaitable[_Job]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(http_request: web.Request) -> web.StreamResponse:
            started = time.monotonic()
            if self.inflight >= self.max_inflight:
                return self._fail(
                    name,
                    "",
                    ServiceUnavailable(
                        f"The frontend serves its maximum of {self.max_inflight} requests at once; "
                        "retry later (or raise --max-inflight).",
                        code="overloaded",
                        headers={"Retry-After": "1"},
                    ),
                )
            self.inflight += 1
            self.idle.clear()
            model = ""
            try:
                job = await prepare(await self._read_body(http_request))
                model = job.model
                self.metrics.inflight.labels(model).inc()
                try:
                    response = await self._run(http_request, job, started)
                finally:
                    self.metrics.inflight.labels(model).dec()
                self.metrics.requests.labels(model, name, str(response.status)).inc()
                return response
            except ApiError as e:
                return self._fail(name, model, e)
            except asyncio.CancelledError:
                self.metrics.errors.labels("client_disconnected").inc()
                self.metrics.requests.labels(model, name, "499").inc()
                raise
            finally:
                self.inflight -= 1
                if not self.inflight:
                    self.idle.set()
                if model:
                    self.metrics.duration.labels(model).observe(time.monotonic() - started)

        return handler

    async def _read_body(self, http_request: web.Request) -> bytes:
        try:
            async with asyncio.timeout(self.body_read_timeout_s):
                return await http_request.read()
        except TimeoutError:
            raise RequestTimeout(
                f"The request body did not arrive within {self.body_read_timeout_s:g}s; send it whole.",
                code="request_timeout",
            ) from None

    def _fail(self, endpoint: str, model: str, error: ApiError) -> web.Response:
        self.metrics.errors.labels(error.code or error.type).inc()
        self.metrics.requests.labels(model, endpoint, str(error.status)).inc()
        if error.status >= 500:
            log.warning(
                "Request failed status=%d code=%s message=%s", error.status, error.code, error.message
            )
        return _error_response(error)

    async def _chat(self, body: bytes) -> _Job:
        req = parse_request(ChatCompletionRequest, body)
        entry = self.registry.lookup(req.model)
        pre = entry.preprocessor
        assert pre is not None
        if has_images(req):  # processor -> encode worker -> language worker (frontend.multimodal)
            if self.multimodal is None:
                raise InvalidRequest("This frontend takes no images.", param="messages", code="unsupported")
            ids, spans, _ = await self.multimodal.prepare(entry, req, pre)
            job = self._job("chat", req, entry, ids, req.token_limit(), "messages", default_max=None)
            job.generate = job.generate.model_copy(update={"images": spans})
            return job
        plan = plan_chat(req, serving(pre))
        messages = chat_messages(req)
        kwargs = (plan.template_kwargs,) if plan is not None and plan.template_kwargs else ()
        ids = await _tokenize(
            sum(len(m["content"]) for m in messages),
            pre.encode_chat,
            messages,
            req.add_generation_prompt,
            *kwargs,
        )
        return self._with_plan(
            self._job("chat", req, entry, ids, req.token_limit(), "messages", default_max=None), plan
        )

    async def _completion(self, body: bytes) -> _Job:
        req = parse_request(CompletionRequest, body)
        entry = self.registry.lookup(req.model)
        pre = entry.preprocessor
        assert pre is not None
        plan = plan_completion(req, serving(pre))
        prompt = req.prompt_text_or_ids()
        if isinstance(prompt, str):
            ids = await _tokenize(len(prompt), pre.encode_prompt, prompt)
        else:
            pre.check_ids(prompt)
            ids = prompt
        job = self._job(
            "completion",
            req,
            entry,
            ids,
            req.token_limit(),
            "prompt",
            default_max=COMPLETIONS_DEFAULT_MAX_TOKENS,
        )
        return self._with_plan(job, plan)

    @staticmethod
    def _with_plan(job: _Job, plan: FeaturePlan | None) -> _Job:
        if plan is not None and (plan.structured or plan.logprobs is not None or plan.answer):
            job.plan = plan
            job.generate = job.generate.model_copy(update=plan.generate_update())
        return job

    async def _embeddings(self, body: bytes) -> _Job:
        return await prepare_embeddings(self.registry, self.embedder, body, _Job)

    def _job(
        self,
        kind: str,
        req: ChatCompletionRequest | CompletionRequest,
        entry: ModelEntry,
        ids: list[int],
        max_tokens: int | None,
        prompt_param: str,
        default_max: int | None,
    ) -> _Job:
        pre = entry.preprocessor
        assert pre is not None
        if not ids:
            raise InvalidRequest(
                "The prompt is empty after tokenization; send some text.",
                param=prompt_param,
                code="empty_prompt",
            )
        room = pre.context_length - len(ids)
        if room < 1:
            raise InvalidRequest(
                f"The prompt has {len(ids)} tokens but the model's context length is {pre.context_length}; "
                "shorten the prompt.",
                param=prompt_param,
                code="context_length_exceeded",
            )
        if max_tokens is None:
            max_tokens = min(default_max, room) if default_max is not None else room
        elif max_tokens > room:
            limit_param = "max_tokens"
            if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
                limit_param = "max_completion_tokens"
            raise InvalidRequest(
                f"The prompt ({len(ids)} tokens) plus {limit_param}={max_tokens} exceeds the model's context "
                f"length of {pre.context_length}; ask for at most {room} tokens.",
                param=limit_param,
                code="context_length_exceeded",
            )
        try:
            sampling = SamplingOptions(
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=-1 if req.top_k is None else req.top_k,
                min_p=req.min_p or 0.0,
                seed=req.seed,
                frequency_penalty=req.frequency_penalty or 0.0,
                presence_penalty=req.presence_penalty or 0.0,
            )
        except ValueError as e:  # the request models already bound every field; kept as a last guard
            raise InvalidRequest(f"Invalid sampling options: {e}", code="invalid_value") from None
        stop_ids = list(req.stop_token_ids or [])
        request_id = uuid.uuid4().hex
        generate = GenerateRequest(
            request_id=request_id,
            model=req.model,
            token_ids=ids,
            sampling=sampling,
            stop=StopConditions(
                max_tokens=max_tokens,
                min_tokens=min(req.min_tokens, max_tokens),
                stop_token_ids=stop_ids,
                ignore_eos=req.ignore_eos,
            ),
            eos_token_ids=list(pre.eos_token_ids),
        )
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        return _Job(
            kind=kind,
            model=req.model,
            entry=entry,
            preprocessor=pre,
            prompt_ids=ids,
            generate=generate,
            stop_strings=req.stop_strings(),
            stop_token_ids=stop_ids,
            stream=bool(req.stream),
            include_usage=req.include_usage(),
            id=prefix + request_id,
        )

    # --- running a job ------------------------------------------------------------------------

    async def _run(self, http_request: web.Request, job: _Job, started: float) -> web.StreamResponse:
        if job.plan is not None:
            return await job.plan.run(self, http_request, job, started)
        out = OutputText(
            job.preprocessor.tokenizer,
            prompt_ids=job.prompt_ids,
            stop_strings=job.stop_strings,
            stop_token_ids=job.stop_token_ids,
        )
        shaper = _Shaper(job)
        ttft, itl = self.metrics.ttft.labels(job.model), self.metrics.itl.labels(job.model)
        self.metrics.input_tokens.labels(job.model).inc(len(job.prompt_ids))
        response: web.StreamResponse | None = None
        completion_tokens = cached_tokens = 0
        finish: str | None = None
        texts: list[str] = []
        last_token_at: float | None = None
        # SSE events not sent yet. Mid-stream an event is sent at once; the events after the finish
        # reason wait for the end of the stream, so it ends in one write instead of four.
        pending: list[bytes] = []

        async def emit(*parts: str) -> None:
            """One event per part (the last one carries the finish reason, once there is one), sent
            in one write."""
            nonlocal response
            if not job.stream:
                texts.extend(parts)
                return
            if response is None:
                response = web.StreamResponse(
                    headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
                )
                await response.prepare(http_request)
                if job.kind == "chat":
                    pending.append(shaper.sse(shaper.chunk(None, None, role=True)))
            for text in parts if finish is None else parts[:-1]:
                if text:
                    pending.append(shaper.text_event(text))
            if finish is not None:
                pending.append(shaper.sse(shaper.chunk(parts[-1], finish)))
            elif pending:
                await response.write(b"".join(pending))
                pending.clear()

        try:
            async with contextlib.aclosing(self.dispatcher.generate(job.entry, job.generate)) as chunks:
                async for chunk in chunks:
                    if chunk.token_ids:
                        now = time.monotonic()
                        if last_token_at is None:
                            ttft.observe(now - started)
                        else:
                            itl.observe(now - last_token_at)
                        last_token_at = now
                        # Streamed, every token is an event of its own, also when several arrived
                        # at once (the worker or the request plane coalesced them because a reader
                        # fell behind); those events then leave in one write. Token by token, a stop
                        # string also ends the count of completion tokens at the token holding it.
                        ids = chunk.token_ids
                        one_by_one = len(ids) > 1 and (job.stream or bool(job.stop_strings))
                        parts: list[str] = []
                        for piece in [[t] for t in ids] if one_by_one else [ids]:
                            delta = out.push(piece)
                            completion_tokens += delta.token_count
                            parts.append(delta.text)
                            if delta.stopped:
                                break
                        if delta.stopped:
                            finish = "stop"
                            await emit(*parts)
                            break
                        if any(parts):
                            await emit(*parts)
                    if chunk.finish_reason is not None:
                        if chunk.finish_reason not in _FINISH:
                            raise UpstreamError(
                                f"The worker ended the request early (finish_reason={chunk.finish_reason}) "
                                "without being asked to; retry it.",
                                code="worker_cancelled",
                            )
                        finish = _FINISH[chunk.finish_reason]
                        if chunk.usage is not None:
                            cached_tokens = min(chunk.usage.cached_tokens, len(job.prompt_ids))
                        await emit(out.finish())
                        break
        except ApiError as e:
            if response is None:
                raise
            self.metrics.errors.labels(e.code or e.type).inc()
            log.warning(
                "Stream failed after it started status=%d code=%s message=%s", e.status, e.code, e.message
            )
            await response.write_eof(b"".join(pending) + shaper.sse(e.body()))
            return response
        except ConnectionResetError:
            self.metrics.errors.labels("client_disconnected").inc()
            log.info("Client went away request_id=%s", job.generate.request_id)
            assert response is not None
            return response
        self.metrics.output_tokens.labels(job.model).inc(completion_tokens)
        self.metrics.cached_tokens.labels(job.model).inc(cached_tokens)
        usage = {
            "prompt_tokens": len(job.prompt_ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(job.prompt_ids) + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
        }
        if not job.stream:
            return _json(shaper.whole("".join(texts), finish or "stop", usage))
        if response is None:  # finished without any output: still a valid (empty) stream
            await emit("")
        assert response is not None
        if job.include_usage:
            pending.append(shaper.sse(shaper.usage_chunk(usage)))
        pending.append(b"data: [DONE]\n\n")
        await response.write_eof(b"".join(pending))
        return response


class _Shaper:
    """OpenAI response bodies for one job."""

    def __init__(self, job: _Job) -> None:
        self.job = job
        # A mid-stream text chunk is the same JSON every time but for its text: keep the bytes around
        # it (``chunk(MARK, None)`` cut at the mark) and splice each text in.
        mark = "\x00"
        self._parts = self.sse(self.chunk(mark, None)).split(orjson.dumps(mark))

    def text_event(self, text: str) -> bytes:
        """``sse(chunk(text, None))`` for a non-empty ``text``, without building the dicts."""
        if len(self._parts) != 2:  # the mark occurs elsewhere too (a model name with a NUL in it)
            return self.sse(self.chunk(text, None))
        return self._parts[0] + orjson.dumps(text) + self._parts[1]

    @staticmethod
    def sse(body: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.job.id, "object": obj, "created": self.job.created, "model": self.job.model}

    def chunk(self, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if self.job.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            body = self._base("chat.completion.chunk") | {"choices": [choice]}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            body = self._base("text_completion") | {"choices": [choice]}
        if self.job.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.job.kind == "chat" else "text_completion"
        return self._base(obj) | {"choices": [], "usage": usage}

    def whole(self, text: str, finish: str, usage: dict[str, Any]) -> dict[str, Any]:
        if self.job.kind == "chat":
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            return self._base("chat.completion") | {"choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return self._base("text_completion") | {"choices": [choice], "usage": usage}
