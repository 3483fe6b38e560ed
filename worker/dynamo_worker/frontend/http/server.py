"""The OpenAI HTTP API (aiohttp): routes, the frontend's bound (at most ``max_inflight`` requests at
once, waiting ones included), reading bodies, OpenAI's shape for every answer (``openai_errors``) and
the per-endpoint metrics; thin handlers over the modules that do the work.

- ``POST /v1/chat/completions``, ``POST /v1/completions``: the body is parsed and validated
  (``protocol``), the request waits for a slot of its model (``serving.admission``:
  priority, deadline, 429/503, scale from zero), then ``requests.chat`` or ``requests.completions``
  tokenizes it into a ``requests.job.Job``; a run serves it (``http.answer``): ``PlainRun``, or
  ``FeaturedRun`` when it uses tools, reasoning, structured output or logprobs (a ``FeaturePlan`` on
  the job).
- ``POST /v1/embeddings``: ``requests.embeddings``, then ``http.answer.run_embedding`` (its requests
  batched across clients by ``serving.embedding_batcher``).
- ``POST /v1/images/generations``: ``serving.image_generation`` (diffusion workers).
- ``GET /v1/models``, ``/v1/models/{model}``, ``/health``, ``/live``, ``/metrics``: ``info_endpoints``.
- With API keys, every route but ``/health``, ``/live`` and ``/metrics`` needs one (``auth``).

Bodies are ``protocol`` models shaped by ``output.shaping``; errors are OpenAI's (``errors``).
A client that goes away cancels the handler (``handler_cancellation``), which closes the worker
streams, which cancels the request on the workers.

The second bound, per model, is ``serving.admission`` (its slots and wait queue).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from dynamo_worker.frontend.errors import (
    ApiError,
    InvalidRequest,
    RequestTimeout,
    ServiceUnavailable,
)
from dynamo_worker.frontend.http.answer import (
    FeaturedRun,
    PlainRun,
    error_response,
    json_response,
    run_embedding,
)
from dynamo_worker.frontend.http.auth import api_key_middleware
from dynamo_worker.frontend.http.info_endpoints import InfoEndpoints
from dynamo_worker.frontend.metrics import FrontendMetrics
from dynamo_worker.frontend.models.registry import ModelRegistry
from dynamo_worker.frontend.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GeneratedImages,
    dump,
    parse_request,
)
from dynamo_worker.frontend.requests.chat import prepare_chat
from dynamo_worker.frontend.requests.chat_images import MultimodalProcessor
from dynamo_worker.frontend.requests.completions import prepare_completion
from dynamo_worker.frontend.requests.embeddings import EmbeddingRequest, prepare_embeddings
from dynamo_worker.frontend.requests.job import EmbeddingPlan, FeaturePlan, Job
from dynamo_worker.frontend.serving.admission import Admission, request_hints
from dynamo_worker.frontend.serving.dispatch import ChunkSource
from dynamo_worker.frontend.serving.embedding_batcher import EmbeddingBatcher
from dynamo_worker.frontend.serving.image_generation import ImagesApi

log = logging.getLogger(__name__)

__all__ = ["MAX_BODY_BYTES", "OpenAIServer"]

# A client that sends its body this slowly holds an in-flight slot; past the bound it gets a 408.
BODY_READ_TIMEOUT_S = 30.0
MAX_BODY_BYTES = 32 * 1024 * 1024


class OpenAIServer:
    def __init__(
        self,
        registry: ModelRegistry,
        dispatcher: ChunkSource,
        metrics: FrontendMetrics,
        *,
        max_inflight: int,
        embedding_batch_window_s: float = 0.002,
        multimodal: MultimodalProcessor | None = None,
        images: ImagesApi | None = None,
        admission: Admission | None = None,
        starting: Callable[[], list[str]] | None = None,
        api_keys: tuple[bytes, ...] = (),
    ) -> None:
        self.starting = starting  # models whose first prefill/decode pairs warm up (/health waits)
        self.admission = admission or Admission(
            registry, metrics, max_queued=0, queue_ttl_s=0.0, scale_up_timeout_s=0.0
        )
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
        self.api_keys = api_keys  # none: every route is open (http.auth)

    def app(self) -> web.Application:
        auth = [api_key_middleware(self.api_keys, self.metrics)] if self.api_keys else []
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[openai_errors, *auth])
        app.router.add_post("/v1/chat/completions", self._endpoint("chat", ChatCompletionRequest, self._chat))
        app.router.add_post(
            "/v1/completions", self._endpoint("completion", CompletionRequest, self._completion)
        )
        app.router.add_post("/v1/embeddings", self._endpoint("embedding", EmbeddingRequest, self._embeddings))
        app.router.add_post("/v1/images/generations", self._image_generations)
        InfoEndpoints(self.registry, self.metrics, self.starting).add_routes(app)
        return app

    # --- images -----------------------------------------------------------------------------

    async def _image_generations(self, http_request: web.Request) -> web.Response:
        if self.images is None:
            return self._fail(
                "images", "", InvalidRequest("This frontend generates no images.", code="unsupported")
            )
        self._enter()
        try:
            body = await self._read_body(http_request)
            images: GeneratedImages = await self.images.generate(body)
        except ApiError as e:
            return self._fail("images", "", e)
        finally:
            self._leave()
        self.metrics.requests.labels("", "images", "200").inc()
        return json_response(dump(images))

    # --- generation endpoints -----------------------------------------------------------------

    async def _chat(self, req: Any) -> Job:
        return await prepare_chat(self.registry, self.multimodal, req)

    async def _completion(self, req: Any) -> Job:
        return await prepare_completion(self.registry, req)

    async def _embeddings(self, req: Any) -> Job:
        return await prepare_embeddings(self.registry, req)

    def _endpoint(
        self,
        name: str,
        body_model: type[ChatCompletionRequest | CompletionRequest | EmbeddingRequest],
        prepare: Callable[[Any], Awaitable[Job]],
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """The handler of a generation endpoint: the frontend's bound, parse the body, wait for a slot
        of the model (``admission``), ``prepare`` the job, run it, count it."""

        async def handler(http_request: web.Request) -> web.StreamResponse:
            started = time.monotonic()
            if self.inflight >= self.max_inflight:
                return self._fail(name, "", self._overloaded())
            self._enter()
            model = ""
            try:
                req = parse_request(body_model, await self._read_body(http_request))
                nvext = req.nvext
                hints = request_hints(
                    http_request.headers,
                    nvext.priority if nvext is not None else None,
                    nvext.request_ttl if nvext is not None else None,
                )
                async with self.admission.slot(req.model, hints):
                    job = await prepare(req)
                    model = job.model
                    inflight = self.metrics.of(model).inflight
                    inflight.inc()
                    try:
                        response = await self._run(http_request, job, started)
                    finally:
                        inflight.dec()
                self.metrics.finished(model, name, response.status)
                return response
            except ApiError as e:
                return self._fail(name, model, e)
            except asyncio.CancelledError:
                self.metrics.errors.labels("client_disconnected").inc()
                self.metrics.finished(model, name, 499)
                raise
            finally:
                self._leave()
                if model:
                    self.metrics.of(model).duration.observe(time.monotonic() - started)

        return handler

    async def _run(self, http_request: web.Request, job: Job, started: float) -> web.StreamResponse:
        """Serve ``job``: the run its plan calls for, each given what it uses."""
        plan = job.plan
        if isinstance(plan, EmbeddingPlan):
            return await run_embedding(self.embedder, self.metrics, job, plan)
        run = FeaturedRun if isinstance(plan, FeaturePlan) else PlainRun  # PlainRun: the fast path
        return await run(self.dispatcher, self.metrics, http_request, job, started).run()

    # --- admission and failures ---------------------------------------------------------------

    def _overloaded(self) -> ServiceUnavailable:
        return ServiceUnavailable(
            f"The frontend serves its maximum of {self.max_inflight} requests at once; "
            "retry later (or raise --max-inflight).",
            code="overloaded",
            headers={"Retry-After": "1"},
        )

    def _enter(self) -> None:
        self.inflight += 1
        self.idle.clear()

    def _leave(self) -> None:
        self.inflight -= 1
        if not self.inflight:
            self.idle.set()

    async def _read_body(self, http_request: web.Request) -> bytes:
        return await read_body(http_request, self.body_read_timeout_s)

    def _fail(self, endpoint: str, model: str, error: ApiError) -> web.Response:
        self.metrics.errors.labels(error.code or error.type).inc()
        self.metrics.finished(model, endpoint, error.status)
        if error.status >= 500:
            log.warning(
                "Request failed status=%d code=%s message=%s", error.status, error.code, error.message
            )
        return error_response(error)


# --- reading bodies, and OpenAI's shape for every answer -------------------------------------------


async def read_body(http_request: web.Request, timeout_s: float) -> bytes:
    """The whole body, or ``RequestTimeout`` when it takes longer than ``timeout_s``: a client that sends
    its body this slowly holds an in-flight slot."""
    try:
        async with asyncio.timeout(timeout_s):
            return await http_request.read()
    except TimeoutError:
        raise RequestTimeout(
            f"The request body did not arrive within {timeout_s:g}s; send it whole.",
            code="request_timeout",
        ) from None


@web.middleware
async def openai_errors(
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
        return json_response(orjson.dumps(error.body()), status=e.status)
    except Exception:  # a bug: map it to OpenAI's shape and log it, never leak a traceback
        log.exception("Unhandled error method=%s path=%s", request.method, request.path)
        error = ApiError("Internal error in the frontend; see its log.", code="internal_error")
        return json_response(orjson.dumps(error.body()), status=500)
