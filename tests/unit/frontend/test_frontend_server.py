"""The HTTP layer without workers: request validation (400 naming the field, malformed JSON), unknown
models (404), models whose workers are gone or unreachable (503/502), decode-only fleets (503 with the
reason), the over-limit answer (503 overloaded), /v1/models, /health and /live, and /metrics. A real
aiohttp server on 127.0.0.1 with the real registry, router and request-plane client; the worker
addresses point at closed ports."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer
from dynamo_worker.frontend.dispatch import Dispatcher
from dynamo_worker.frontend.metrics import FrontendMetrics
from dynamo_worker.frontend.preprocess import Preprocessor
from dynamo_worker.frontend.registry import ModelRegistry
from dynamo_worker.frontend.server import OpenAIServer
from dynamo_worker.protocol import InstanceRecord
from dynamo_worker.router import Router
from dynamo_worker.runtime.discovery import InstanceAdded, InstanceRemoved
from dynamo_worker.runtime.nats_server import free_port
from dynamo_worker.runtime.request_plane import RequestClient


def record(worker_id: str, role: str = "agg", model: str = "tiny") -> InstanceRecord:
    return InstanceRecord(
        instance_id=worker_id,
        namespace="ns",
        component="backend",
        role=role,
        model=model,
        address=f"127.0.0.1:{free_port()}",
        page_size=4,
        total_kv_blocks=100,
    )


@pytest.fixture
async def api(model_dir):
    router = Router("round-robin")

    async def load(_: InstanceRecord) -> Preprocessor:
        return Preprocessor.from_dir(model_dir)

    registry = ModelRegistry(router, load, "ns", load_timeout_s=10)
    client = RequestClient(connect_timeout=2, first_chunk_timeout=5, idle_timeout=5)
    dispatcher = Dispatcher(
        router, client, connect_timeout_s=2, first_token_timeout_s=5, inter_token_timeout_s=5
    )
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
        while rec.model not in registry.served():
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
        ({**CHAT, "logprobs": True}, "logprobs"),
        ({**CHAT, "response_format": {"type": "json_object"}}, "response_format"),
        ({**CHAT, "tools": [{"type": "function"}]}, "tools"),
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


async def test_single_unreachable_worker_reports_the_worker_failure(api):
    http, registry, _ = api
    await add(registry, record("a" * 16))
    r = await http.post("/v1/completions", json={"model": "tiny", "prompt": "hi"})
    err = (await r.json())["error"]
    assert r.status == 502 and err["code"] == "worker_unreachable"


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
