"""The endpoint picker's pure parts: the ext_proc answers it builds (destination header and ``envoy.lb``
metadata, the body handed back in chunks under Envoy's 64 KB, OpenAI-shaped immediate answers), flow
control (priority order, a full queue, a wait past its bound), its flags' checks, and the docs' Envoy
configuration being the file the tests run."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from dynamo_worker.epp import wire
from dynamo_worker.epp.flow import FlowControl, QueueFull, QueueTimeout
from dynamo_worker.epp.settings import EppSettings
from dynamo_worker.protocol import LoadMetrics
from dynamo_worker.runtime.settings import SettingsError

ROOT = Path(__file__).resolve().parents[3]


def test_the_headers_answer_names_the_destination_in_a_header_and_in_envoy_lb_metadata():
    r = wire.headers_response(
        "10.0.0.7:8000", {"x-dynamo-worker-instance-id": "w1"}, ["x-dynamo-prefill-instance-id"]
    )
    common = r.request_headers.response
    assert common.clear_route_cache
    set_ = {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}
    assert set_ == {"x-dynamo-worker-instance-id": "w1", "x-gateway-destination-endpoint": "10.0.0.7:8000"}
    assert list(common.header_mutation.remove_headers) == ["x-dynamo-prefill-instance-id"]
    lb = r.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert lb["x-gateway-destination-endpoint"].string_value == "10.0.0.7:8000"


def test_the_body_goes_back_in_chunks_under_64_kb_the_last_ending_the_stream():
    body = bytes(range(256)) * 1000  # 256 000 bytes
    answers = wire.body_responses(body)
    chunks = [a.request_body.response.body_mutation.streamed_response for a in answers]
    assert b"".join(c.body for c in chunks) == body
    assert all(len(c.body) < 64 * 1024 for c in chunks)
    assert [c.end_of_stream for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert wire.body_responses(b"")[0].request_body.response.body_mutation.streamed_response.end_of_stream


def test_an_immediate_answer_is_an_openai_error_with_its_status_and_headers():
    body = {"error": {"message": "m", "type": "rate_limit_error", "param": None, "code": "queue_full"}}
    r = wire.immediate_response(429, body, {"Retry-After": "3"}).immediate_response
    assert r.status.code == 429
    assert json.loads(r.body) == body
    headers = {h.header.key: h.header.raw_value.decode() for h in r.headers.set_headers}
    assert headers == {"content-type": "application/json", "Retry-After": "3"}


def load(worker: str, waiting: int = 0, active: int = 0) -> LoadMetrics:
    return LoadMetrics(instance_id=worker, active_blocks=active, total_blocks=100, waiting=waiting, running=1)


async def test_saturated_requests_wait_and_are_admitted_by_priority_then_arrival():
    flow = FlowControl(queue_depth=2, kv_usage=0.9, max_queued=10, timeout_s=5)
    flow.report(load("w", waiting=2))
    order: list[str] = []

    async def request(name: str, priority: int) -> None:
        await flow.admit("m", priority, lambda: ["w"])
        order.append(name)

    tasks = [asyncio.create_task(request(n, p)) for n, p in (("low", -1), ("first", 5), ("second", 5))]
    await asyncio.sleep(0.01)
    assert order == [] and flow.queued("m") == 3
    flow.report(load("w", waiting=1))  # room for one
    await asyncio.sleep(0.01)
    assert order == ["first"]
    flow.report(load("w", waiting=0))  # room for two
    await asyncio.gather(*tasks)
    assert order == ["first", "second", "low"]


async def test_a_full_queue_refuses_at_once_and_a_long_wait_times_out():
    flow = FlowControl(queue_depth=5, kv_usage=0.5, max_queued=1, timeout_s=0.05)
    flow.report(load("w", active=60))  # 60 % of its KV in use: saturated
    waiting = asyncio.create_task(flow.admit("m", 0, lambda: ["w"]))
    await asyncio.sleep(0.01)
    with pytest.raises(QueueFull):
        await flow.admit("m", 0, lambda: ["w"])
    with pytest.raises(QueueTimeout):
        await waiting
    await flow.admit("other", 0, lambda: [])  # no worker: not saturation, the picker answers


def test_bad_objectives_and_frontends_are_refused_naming_the_flag():
    with pytest.raises(SettingsError, match="--objectives"):
        EppSettings.parse(["--frontends", "fe:8000", "--objectives", "chat=high"], {})
    with pytest.raises(SettingsError, match="--frontends"):
        EppSettings.parse(["--frontends", "fe"], {})
    s = EppSettings.parse(["--frontends", "fe:8000,[::1]:8001", "--objectives", "chat=10,batch=-5"], {})
    assert s.frontend_list() == [("fe", 8000), ("::1", 8001)]
    assert (s.priority("chat"), s.priority("batch"), s.priority(None), s.priority("x")) == (10, -5, 0, 0)


def test_the_docs_show_the_envoy_configuration_the_tests_run_and_every_flag():
    doc = (ROOT / "docs" / "gateway-api.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", doc, re.S)
    assert block is not None
    assert block[1] == (ROOT / "docs" / "gateway-api-envoy.yaml").read_text()
    for name in EppSettings.model_fields:
        assert f"`--{name.replace('_', '-')}`" in doc, name
