"""The HTTP layer without real workers: request validation (400 naming the field, malformed JSON),
unknown models (404), models whose workers are gone or unreachable (503/502), decode-only fleets (503
with the reason, neither listed nor healthy), a worker ending a request early (an error, never "stop"),
the over-limit answer (503 overloaded), /v1/models, /health and /live, and /metrics. A real aiohttp
server on 127.0.0.1 with the real registry, router and request-plane client; the worker addresses point
at closed ports, except one real request-plane server with a scripted engine (neither the mocker nor
SGLang can be made to end a request early on demand)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from dynamo_worker.frontend.http.server import MAX_BODY_BYTES, OpenAIServer
from dynamo_worker.frontend.metrics import FrontendMetrics
from dynamo_worker.frontend.models.preprocessor import Preprocessor
from dynamo_worker.frontend.models.registry import ModelRegistry
from dynamo_worker.frontend.serving.dispatch import Dispatcher
from dynamo_worker.protocol import GenerateChunk, GenerateRequest, InstanceRecord
from dynamo_worker.router import Router
from dynamo_worker.runtime.discovery import InstanceAdded, InstanceRemoved
from dynamo_worker.runtime.request_plane import RequestClient, RequestServer

from tests.support.bpe_model import build_tokenizer, write_model_dir
from tests.support.ports import refused_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The small BPE tokenizer (tests/support/bpe_model.py) in a model folder."""
    return write_model_dir(tmp_path_factory.mktemp("model"), build_tokenizer())


def record(worker_id: str, role: str = "agg", model: str = "tiny") -> InstanceRecord:
    return InstanceRecord(
        instance_id=worker_id,
        namespace="ns",
        component="backend",
        role=role,
        model=model,
        address=f"127.0.0.1:{refused_port()}",
        page_size=4,
        total_kv_blocks=100,
    )


@pytest.fixture
async def api(model_dir):
    router = Router("round-robin")

    async def load(_: InstanceRecord) -> Preprocessor:
        return Preprocessor.from_dir(model_dir)

    registry = ModelRegistry(router, load, "ns", load_timeout_s=10)
    client = RequestClient(connect_timeout_s=2, first_token_timeout_s=5, inter_token_timeout_s=5)
    dispatcher = Dispatcher(router, client)
    server = OpenAIServer(registry, dispatcher, FrontendMetrics(), max_inflight=4)
    http = TestClient(TestServer(server.app(), host="127.0.0.1"))
    await http.start_server()
    yield http, registry, server
    await http.close()
    await registry.close()
    await client.close()


async def add(registry: ModelRegistry, rec: InstanceRecord) -> None:
    registry.apply(InstanceAdded(rec))
    async with asyncio.timeout(10):
        while (entry := registry.get(rec.model)) is None or entry.preprocessor is None:
            await registry.wait_changed()


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}]}


async def test_no_workers_at_all_is_503(api):
    http, _, _ = api
    r = await http.post("/v1/chat/completions", json=CHAT)
    body = await r.json()
    assert r.status == 503 and body["error"]["code"] == "no_workers"
    assert (await http.get("/health")).status == 503
    assert (await http.get("/live")).status == 200


async def test_unknown_model_is_404_naming_served_models(api):
    http, registry, _ = api
    await add(registry, record("a" * 16))
    r = await http.post("/v1/completions", json={"model": "nope", "prompt": "hi"})
    body = await r.json()
    assert r.status == 404 and body["error"]["param"] == "model" and "tiny" in body["error"]["message"]
    assert body["error"]["code"] == "model_not_found"


async def test_models_and_health_follow_discovery(api):
    http, registry, _ = api
    rec = record("a" * 16)
    await add(registry, rec)
    models = await (await http.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["created"] > 1_700_000_000  # a unix time, as OpenAI's
    assert (await http.get("/health")).status == 200
    registry.apply(InstanceRemoved(rec.instance_id, rec))
    assert (await (await http.get("/v1/models")).json())["data"] == []
    r = await http.post("/v1/chat/completions", json=CHAT)
    assert r.status == 503 and (await r.json())["error"]["code"] == "no_workers"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tiny"}, "messages"),
        ({"model": "tiny", "messages": []}, "messages"),
        ({"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({**CHAT, "n": 2}, "n"),
        ({**CHAT, "temperature": 3}, "temperature"),
        ({**CHAT, "top_p": 0}, "top_p"),
        ({**CHAT, "top_k": 0}, "top_k"),
        ({**CHAT, "max_tokens": 0}, "max_tokens"),
        ({**CHAT, "max_tokens": "5"}, "max_tokens"),
        ({**CHAT, "stop": 3}, "stop"),
        ({**CHAT, "logprobs": "yes"}, "logprobs"),
        ({**CHAT, "top_logprobs": 3}, "top_logprobs"),
        ({**CHAT, "response_format": {"type": "xml"}}, "response_format.type"),
        ({**CHAT, "tools": [{"type": "function"}]}, "tools[0].function"),
        ({**CHAT, "functions": [{"name": "f"}]}, "functions"),
        ({**CHAT, "function_call": "auto"}, "function_call"),
        ({**CHAT, "logit_bias": {"5": 100}}, "logit_bias"),
        ({**CHAT, "audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
        (
            {**CHAT, "messages": [{"role": "assistant", "tool_calls": [{"id": "1", "type": "function"}]}]},
            "messages[0].tool_calls[0].function",
        ),
        ({**CHAT, "max_completion_tokens": 10**6}, "max_completion_tokens"),
        ({**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}, "messages"),
    ],
)
async def test_bad_chat_fields_are_400_naming_the_field(api, body, param):
    http, registry, _ = api
    await add(registry, record("a" * 16))
    r = await http.post("/v1/chat/completions", json=body)
    err = (await r.json())["error"]
    assert r.status == 400, err
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tiny", "prompt": [1, 10**7]}, "prompt[1]"),
        ({"model": "tiny", "prompt": ["a", "b"]}, "prompt"),
        ({"model": "tiny", "prompt": "hi", "echo": True}, "echo"),
        ({"model": "tiny", "prompt": "hi", "max_tokens": 10**6}, "max_tokens"),
        ({"model": "tiny", "prompt": ""}, "prompt"),
        ({"model": "tiny", "prompt": []}, "prompt"),
        ({"model": "tiny", "prompt": [[]]}, "prompt"),
        ({"model": "tiny", "prompt": "hi", "logit_bias": {"5": 100}}, "logit_bias"),
    ],
)
async def test_bad_completion_fields_are_400(api, body, param):
    http, registry, _ = api
    await add(registry, record("a" * 16))
    r = await http.post("/v1/completions", json=body)
    err = (await r.json())["error"]
    assert r.status == 400 and err["param"] == param, err


async def test_malformed_json_is_400(api):
    http, _, _ = api
    for raw in (b"{", b"not json", b"[1, 2]", b""):
        r = await http.post("/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"})
        err = (await r.json())["error"]
        assert r.status == 400 and err["code"] == "invalid_json", raw


async def test_unreachable_workers_give_502_after_trying_another(api):
    http, registry, _ = api
    await add(registry, record("a" * 16))
    await add(registry, record("b" * 16))
    r = await http.post("/v1/chat/completions", json=CHAT)
    err = (await r.json())["error"]
    assert r.status == 502 and err["code"] == "worker_unreachable"


async def test_decode_only_fleet_is_503_never_decode_alone(api):
    http, registry, _ = api
    await add(registry, record("d" * 16, role="decode"))
    r = await http.post("/v1/chat/completions", json=CHAT)
    err = (await r.json())["error"]
    assert r.status == 503 and err["code"] == "no_prefill_workers" and "prefill" in err["message"]


@pytest.mark.parametrize("roles", [("prefill",), ("decode",), ("prefill", "prefill")])
async def test_model_that_cannot_be_served_is_not_listed_nor_healthy(api, roles):
    http, registry, _ = api
    for i, role in enumerate(roles):
        await add(registry, record(str(i) * 16, role=role))
    assert (await (await http.get("/v1/models")).json())["data"] == []
    r = await http.get("/health")
    assert r.status == 503 and "prefill and decode" in (await r.json())["reason"]
    await add(registry, record("a" * 16, role="decode" if "prefill" in roles else "prefill"))
    assert [m["id"] for m in (await (await http.get("/v1/models")).json())["data"]] == ["tiny"]
    assert (await http.get("/health")).status == 200


async def test_over_max_inflight_is_refused_at_once(api):
    http, registry, server = api
    await add(registry, record("a" * 16))
    server.max_inflight = 0
    r = await http.post("/v1/chat/completions", json=CHAT)
    err = (await r.json())["error"]
    assert r.status == 503 and err["code"] == "overloaded" and r.headers["Retry-After"] == "1"


async def test_metrics_count_errors_by_type(api):
    http, _, _ = api
    await http.post("/v1/chat/completions", data=b"{")
    text = await (await http.get("/metrics")).text()
    assert 'dynamo_frontend_errors_total{type="invalid_json"} 1.0' in text


async def test_unknown_path_and_method_are_openai_shaped(api):
    http, _, _ = api
    r = await http.get("/v1/nothing")
    assert r.status == 404 and (await r.json())["error"]["message"]
    r = await http.get("/v1/chat/completions")
    assert r.status == 405 and (await r.json())["error"]["type"] == "invalid_request_error"


async def test_single_unreachable_worker_is_503_naming_the_role_and_the_failure(api):
    http, registry, _ = api
    await add(registry, record("a" * 16))
    for _ in range(2):  # the first request finds it dead; the next one does not try it again
        r = await http.post("/v1/completions", json={"model": "tiny", "prompt": "hi"})
        err = (await r.json())["error"]
        assert r.status == 503 and err["code"] == "no_workers"
        assert "No live agg worker" in err["message"] and "could not connect" in err["message"]
        assert r.headers["Retry-After"] == "1"


async def test_new_model_card_is_loaded_when_a_worker_brings_one(model_dir):
    loads: list[str | None] = []

    async def load(rec: InstanceRecord) -> Preprocessor:
        loads.append(rec.model_card_checksum)
        return Preprocessor.from_dir(model_dir)

    registry = ModelRegistry(Router("round-robin"), load, "ns", load_timeout_s=10)
    first = record("a" * 16).model_copy(update={"model_card_checksum": "c1"})
    registry.apply(InstanceAdded(first))
    await add(registry, first)
    registry.apply(InstanceAdded(record("b" * 16).model_copy(update={"model_card_checksum": "c1"})))
    registry.apply(InstanceAdded(record("c" * 16).model_copy(update={"model_card_checksum": "c2"})))
    async with asyncio.timeout(10):
        while registry.get("tiny").card_checksum != "c2":
            await registry.wait_changed()
    assert loads == ["c1", "c2"]
    await registry.close()


async def test_worker_cancelling_on_its_own_is_an_error_not_a_stop(api):
    """A worker's ``cancelled`` finish means the output was cut short: the client must not see a
    normal ``stop`` (whole response: 502; stream: an error event and no [DONE])."""

    async def cancels(_: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        yield GenerateChunk(token_ids=[5, 6])
        yield GenerateChunk(finish_reason="cancelled")

    worker = RequestServer(cancels)
    port = await worker.start()
    try:
        http, registry, _ = api
        rec = record("a" * 16).model_copy(update={"address": f"127.0.0.1:{port}"})
        await add(registry, rec)
        r = await http.post("/v1/chat/completions", json=CHAT)
        err = (await r.json())["error"]
        assert r.status == 502 and err["code"] == "worker_cancelled", err
        r = await http.post("/v1/chat/completions", json={**CHAT, "stream": True})
        body = await r.text()
        assert r.status == 200 and '"code":"worker_cancelled"' in body and "[DONE]" not in body
        assert '"finish_reason":"stop"' not in body
    finally:
        await worker.stop()


async def test_body_that_never_arrives_is_408_and_frees_its_slot(api):
    http, registry, server = api
    await add(registry, record("a" * 16))
    server.body_read_timeout_s = 0.5
    reader, writer = await asyncio.open_connection("127.0.0.1", http.port)
    try:
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        await writer.drain()
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408")
    finally:
        writer.close()
        await writer.wait_closed()
    async with asyncio.timeout(10):
        await server.idle.wait()


async def test_oversized_body_is_413_naming_the_limit(api):
    http, _, _ = api
    r = await http.post("/v1/completions", data=io.BytesIO(b"x" * (MAX_BODY_BYTES + 1)))
    err = (await r.json())["error"]
    assert r.status == 413 and "32 MiB" in err["message"]
