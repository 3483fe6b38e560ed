"""The ext_proc stream of one HTTP request: collect its headers and body, decide, answer.

Per request (one gRPC ``Process`` stream): the request headers arrive, then the body in chunks (Envoy's
full-duplex streamed mode, at most 64 KB each) until ``end_of_stream`` (or trailers); the body is
buffered whole, parsed, admitted by flow control (``flow``), decided (``picker``), and answered
(``wire``): the destination frontend, the workers' headers, the body handed back. The routing headers a
client sent are removed whatever the outcome. Errors are ``ImmediateResponse``s: 400 for a body that is
not a request (not JSON, a field wrong), 413 for a body over ``--max-body-bytes``, 429 with
``Retry-After`` when the model's queue is full or the wait too long, 503 with ``Retry-After`` when no
worker can serve, and whatever the frontend would answer for the request itself (unknown model 404...).

The decision's flights (``picker``: the request's load on its workers) end exactly once, when the
request does: at a refusal, at the response's trailers, or when the stream ends, however it ends
(Envoy half-closes it once the response is over when it is to send response trailers; it resets it
when the client goes away). Response headers, when Envoy sends them, mark the first token and pass
unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from dynamo_worker.epp import wire
from dynamo_worker.epp.flow import FlowControl, QueueFull, QueueTimeout, Workers
from dynamo_worker.epp.metrics import EppMetrics
from dynamo_worker.epp.picker import Decision, Picker, parse
from dynamo_worker.frontend.errors import ApiError, InvalidRequest, ServiceUnavailable, TooManyRequests
from dynamo_worker.frontend.serving.direct import PREFILL_HEADER, ROUTING_HEADERS, WORKER_HEADER

log = logging.getLogger(__name__)

__all__ = ["ExtProc"]

REMOVED = (*ROUTING_HEADERS, wire.DESTINATION_HEADER)  # a client never chooses these


class _Request:
    """What one stream has seen, and what it holds until it ends."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.answered = False
        self.decision: Decision | None = None

    def end(self) -> None:
        """The request is over for the picker: its workers' load drops (idempotent)."""
        if self.decision is not None:
            self.decision.done()


class ExtProc(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(
        self,
        picker: Picker,
        flow: FlowControl,
        metrics: EppMetrics,
        destination: Callable[[], str | None],
        workers: Callable[[str], Workers],
        *,
        priority: Callable[[str | None], int],
        retry_after_s: int,
        max_body_bytes: int,
    ) -> None:
        self.picker = picker
        self.flow = flow
        self.metrics = metrics
        self.destination = destination
        self.workers = workers  # a model -> the workers its saturation is read from
        self.priority = priority
        self.retry_after_s = retry_after_s
        self.max_body_bytes = max_body_bytes

    async def Process(self, request_iterator: AsyncIterator[Any], context: Any) -> None:
        # the reader-writer form, not an async generator: the ``finally`` runs as the RPC ends, even
        # when it is cancelled while a response is being written
        state = _Request()
        try:
            async for message in request_iterator:
                for response in await self._on(state, message):
                    await context.write(response)
        finally:
            state.end()

    async def _on(self, state: _Request, message: Any) -> list[Any]:
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            state.headers = wire.header_map(message.request_headers.headers)
            if message.request_headers.end_of_stream:
                return await self._answer(state, with_body=False)
            return []
        if kind == "request_body":
            if state.answered:  # refused already (too large): nothing more to keep
                return []
            state.body += message.request_body.body
            if len(state.body) > self.max_body_bytes:
                return [self._refuse(state, _too_large(self.max_body_bytes))]
            if message.request_body.end_of_stream:
                return await self._answer(state, with_body=True)
            return []
        if kind == "request_trailers":
            answers = [] if state.answered else await self._answer(state, with_body=True)
            if answers and answers[-1].WhichOneof("response") == "immediate_response":
                return answers
            return [*answers, wire.trailers_response()]
        if kind == "response_headers":
            if state.decision is not None:
                state.decision.first_token()
            return [wire.response_headers_response()]
        if kind == "response_trailers":
            state.end()
            return [wire.response_trailers_response()]
        log.warning("Ignored an ext_proc message this picker is not configured for kind=%s", kind)
        return []

    async def _answer(self, state: _Request, *, with_body: bool) -> list[Any]:
        state.answered = True
        started = time.monotonic()
        body = bytes(state.body)
        try:
            parsed = parse(state.headers.get(":path", ""), body)
            if parsed is not None:
                await self._admit(parsed.model, state.headers.get(wire.OBJECTIVE_HEADER))
                state.decision = await self.picker.pick(parsed)
        except ApiError as e:
            return [self._refuse(state, e)]
        destination = self.destination()
        if destination is None:
            return [self._refuse(state, _no_frontend())]
        decision = state.decision or Decision()
        named = {WORKER_HEADER: decision.worker, PREFILL_HEADER: decision.prefill}
        chosen = {k: v for k, v in named.items() if v is not None}
        self.metrics.decided(decision.model, decision.roles(), time.monotonic() - started)
        log.debug("Picked destination=%s workers=%s", destination, chosen)
        answers = [wire.headers_response(destination, chosen, REMOVED)]
        return answers + wire.body_responses(body) if with_body else answers

    async def _admit(self, model: str, objective: str | None) -> None:
        try:
            await self.flow.admit(model, self.priority(objective), self.workers(model))
        except QueueFull:
            raise TooManyRequests(
                f"Model '{model}' has {self.flow.queued(model)} requests waiting, as many as the endpoint "
                f"picker queues (--max-queued {self.flow.max_queued}). Retry after {self.retry_after_s}s, "
                "or add workers.",
                code="queue_full",
                headers={"Retry-After": str(self.retry_after_s)},
            ) from None
        except QueueTimeout:
            raise TooManyRequests(
                f"The request waited {self.flow.timeout_s:.0f}s (--queue-timeout-s) for a worker of model "
                f"'{model}' below --queue-depth-threshold {self.flow.queue_depth} waiting requests and "
                f"--kv-cache-util-threshold {self.flow.kv_usage:g}, and none was. Retry after "
                f"{self.retry_after_s}s, or add workers.",
                code="queue_timeout",
                headers={"Retry-After": str(self.retry_after_s)},
            ) from None

    def _refuse(self, state: _Request, error: ApiError) -> Any:
        state.answered = True
        state.end()
        headers = dict(error.headers)
        if error.status in (429, 503):
            headers.setdefault("Retry-After", str(self.retry_after_s))
        self.metrics.refused(error.status, error.code)
        log.info("Refused a request status=%d code=%s: %s", error.status, error.code, error.message)
        return wire.immediate_response(error.status, error.body(), headers)


def _too_large(limit: int) -> InvalidRequest:
    error = InvalidRequest(
        f"The request body is larger than the endpoint picker reads ({limit} bytes, --max-body-bytes). "
        "Send a smaller request, or raise --max-body-bytes.",
        code="request_too_large",
    )
    error.status = 413
    return error


def _no_frontend() -> ServiceUnavailable:
    return ServiceUnavailable(
        "The endpoint picker knows no frontend to send the request to: none of --frontends resolves. "
        "Check that the frontend replicas run and that --frontends names them.",
        code="no_frontends",
    )
