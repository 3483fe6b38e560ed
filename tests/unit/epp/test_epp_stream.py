"""One ext_proc stream through ``ExtProc`` with Envoy's messages built by hand (the real Envoy runs in
tests/integration/epp): a request with no body (``GET /v1/models``) goes to a frontend unpinned with the
client's routing headers removed, a body over ``--max-body-bytes`` is a 413 before any decision, and a
decided request counts on its worker's load (``Router.started``) from the decision until the request
ends, exactly once, however it ends: the stream half-closed, the response's trailers, a reset
(cancelled), a refusal after the decision."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from dynamo_worker.epp.flow import FlowControl
from dynamo_worker.epp.metrics import EppMetrics
from dynamo_worker.epp.picker import Decision, Parsed
from dynamo_worker.epp.server import ExtProc
from dynamo_worker.protocol import InstanceRecord
from dynamo_worker.router import Router
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

WORKER = "a" * 16
BODY = b'{"model": "m", "prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9], "max_tokens": 2}'


class Context:
    """The servicer context's writer half (what ``Process`` answers with)."""

    def __init__(self) -> None:
        self.written: list[pb.ProcessingResponse] = []
        self.wrote = asyncio.Event()

    async def write(self, response: pb.ProcessingResponse) -> None:
        self.written.append(response)
        self.wrote.set()


class RouterPicker:
    """Picks ``WORKER`` for every request, starting its flight on a real router."""

    def __init__(self) -> None:
        self.router = Router("kv")
        self.worker = InstanceRecord(
            instance_id=WORKER,
            namespace="ns",
            component="agg",
            role="agg",
            model="m",
            address="127.0.0.1:1",
            page_size=4,
            total_kv_blocks=100,
        )
        self.router.add_worker(self.worker)

    async def pick(self, parsed: Parsed) -> Decision:
        choice = self.router.choose("m/agg", [self.worker], [1, 2, 3, 4, 5, 6, 7, 8, 9])
        return Decision(parsed.model, WORKER, None, (self.router.started(choice),))

    def requests(self) -> int:
        return self.router.load_of(WORKER)["requests"]


def extproc(
    max_body_bytes: int = 1024, picker: RouterPicker | None = None, destination: str | None = "127.0.0.1:8000"
) -> ExtProc:
    return ExtProc(
        picker,  # type: ignore[arg-type]  # None: no request here needs a decision
        FlowControl(5, 0.8, 10, 1.0),
        EppMetrics(),
        lambda: destination,
        lambda model: lambda: [],  # no workers: flow control never holds a request
        priority=lambda objective: 0,
        retry_after_s=1,
        max_body_bytes=max_body_bytes,
    )


def headers(path: str, end: bool, **extra: str) -> pb.ProcessingRequest:
    values = {":method": "GET" if end else "POST", ":path": path, **extra}
    header_map = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
    )
    return pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=header_map, end_of_stream=end))


def request(body: bytes = BODY) -> list[pb.ProcessingRequest]:
    last = pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))
    return [headers("/v1/completions", False), last]


async def answers(server: ExtProc, messages: list[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
    async def stream() -> AsyncIterator[pb.ProcessingRequest]:
        for m in messages:
            yield m

    context = Context()
    await server.Process(stream(), context)
    return context.written


class OpenStream:
    """A stream Envoy keeps open after the request (until the response ends): ``Process`` in a task."""

    def __init__(self, server: ExtProc, messages: list[pb.ProcessingRequest]) -> None:
        self.queue: asyncio.Queue[pb.ProcessingRequest | None] = asyncio.Queue()
        for m in messages:
            self.queue.put_nowait(m)
        self.context = Context()
        self.task = asyncio.create_task(server.Process(self._stream(), self.context))

    async def _stream(self) -> AsyncIterator[pb.ProcessingRequest]:
        while (m := await self.queue.get()) is not None:
            yield m

    async def answered(self, n: int) -> list[pb.ProcessingResponse]:
        async with asyncio.timeout(5):
            while len(self.context.written) < n:
                self.context.wrote.clear()
                await self.context.wrote.wait()
        return self.context.written

    async def half_close(self) -> None:
        self.queue.put_nowait(None)
        async with asyncio.timeout(5):
            await self.task


async def test_a_bodyless_request_goes_to_a_frontend_unpinned_without_the_clients_routing_headers():
    (r,) = await answers(extproc(), [headers("/v1/models", True, **{"x-dynamo-worker-instance-id": "w"})])
    mutation = r.request_headers.response.header_mutation
    assert {h.header.key: h.header.raw_value for h in mutation.set_headers} == {
        "x-gateway-destination-endpoint": b"127.0.0.1:8000"
    }
    assert "x-dynamo-worker-instance-id" in mutation.remove_headers
    assert "x-dynamo-prefill-instance-id" in mutation.remove_headers


async def test_a_body_over_the_limit_is_a_413_and_is_read_no_further():
    chunk = pb.ProcessingRequest(request_body=pb.HttpBody(body=b"x" * 800, end_of_stream=False))
    last = pb.ProcessingRequest(request_body=pb.HttpBody(body=b"x", end_of_stream=True))
    out = await answers(extproc(1024), [headers("/v1/completions", False), chunk, chunk, last])
    assert [r.WhichOneof("response") for r in out] == ["immediate_response"]
    assert out[0].immediate_response.status.code == 413
    assert b"--max-body-bytes" in out[0].immediate_response.body


async def test_a_decided_request_counts_on_its_worker_until_envoy_closes_the_stream():
    picker = RouterPicker()
    server = extproc(picker=picker)
    first, second = OpenStream(server, request()), OpenStream(server, request())
    await first.answered(2)
    await second.answered(2)
    assert [r.WhichOneof("response") for r in first.context.written] == ["request_headers", "request_body"]
    assert picker.requests() == 2
    await first.half_close()
    assert picker.requests() == 1
    await second.half_close()
    assert picker.requests() == 0


async def test_the_responses_trailers_end_the_count_once_and_the_stream_end_does_not_again():
    picker = RouterPicker()
    server = extproc(picker=picker)
    other, stream = OpenStream(server, request()), OpenStream(server, request())
    await other.answered(2)
    await stream.answered(2)
    stream.queue.put_nowait(pb.ProcessingRequest(response_trailers=pb.HttpTrailers()))
    written = await stream.answered(3)
    assert written[-1].WhichOneof("response") == "response_trailers"
    assert picker.requests() == 1  # the other request's
    await stream.half_close()
    assert picker.requests() == 1
    await other.half_close()
    assert picker.requests() == 0


async def test_response_headers_pass_unchanged_and_move_the_request_from_prefill_to_decode():
    picker = RouterPicker()
    stream = OpenStream(extproc(picker=picker), request())
    await stream.answered(2)
    assert picker.router.load_of(WORKER)["prefill"] > 0
    stream.queue.put_nowait(pb.ProcessingRequest(response_headers=pb.HttpHeaders()))
    written = await stream.answered(3)
    assert written[-1].response_headers == pb.HeadersResponse()
    load = picker.router.load_of(WORKER)
    assert (load["prefill"], load["requests"]) == (0, 1)
    await stream.half_close()
    assert picker.requests() == 0


async def test_a_reset_stream_ends_the_count():
    picker = RouterPicker()
    stream = OpenStream(extproc(picker=picker), request())
    await stream.answered(2)
    assert picker.requests() == 1
    stream.task.cancel()  # Envoy resets the stream: the client went away
    await asyncio.gather(stream.task, return_exceptions=True)
    assert stream.task.cancelled()
    assert picker.requests() == 0


async def test_a_refusal_after_the_decision_ends_the_count_at_once():
    picker = RouterPicker()
    stream = OpenStream(extproc(picker=picker, destination=None), request())
    (refused,) = await stream.answered(1)
    assert refused.immediate_response.status.code == 503
    assert picker.requests() == 0
    await stream.half_close()
    assert picker.requests() == 0
