"""One ext_proc stream through ``ExtProc`` with Envoy's messages built by hand (the real Envoy runs in
tests/integration/epp): a request with no body (``GET /v1/models``) goes to a frontend unpinned with the
client's routing headers removed, and a body over ``--max-body-bytes`` is a 413 before any decision."""

from __future__ import annotations

from dynamo_worker.epp.flow import FlowControl
from dynamo_worker.epp.metrics import EppMetrics
from dynamo_worker.epp.server import ExtProc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb


def extproc(max_body_bytes: int = 1024) -> ExtProc:
    return ExtProc(
        None,  # type: ignore[arg-type]  # no request here needs a decision
        FlowControl(5, 0.8, 10, 1.0),
        EppMetrics(),
        lambda: "127.0.0.1:8000",
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


async def answers(server: ExtProc, messages: list[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
    async def stream():
        for m in messages:
            yield m

    return [r async for r in server.Process(stream(), None)]


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
