"""``/v1/loras`` over real HTTP in the states the process tests do not reach: the engine still starting,
a multinode follower, a draining worker (``NotReady``, 503), and an engine that takes longer than
``--lora-load-timeout-s`` (``LoadFailed``, 500, the adapter not listed). The engine here is a stand-in
that holds adapters in a dict and can be made slow: the real engines are covered by the mocker and
SGLang worker tests, and this checks only the endpoint's own answers."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from dynamo_worker.runtime.lora import LoraManager
from dynamo_worker.runtime.lora_checks import LoraLimits
from dynamo_worker.runtime.system_server import SystemServer

from tests.support.peft_adapters import write_adapter

pytestmark = pytest.mark.integration

TINY = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}


class SlowEngine:
    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.held: list[str] = []

    async def load_lora(self, name: str, path: str, pinned: bool) -> list[str]:
        await asyncio.sleep(self.delay_s)
        self.held.append(name)
        return list(self.held)

    async def unload_lora(self, name: str) -> list[str]:
        self.held.remove(name)
        return list(self.held)


@pytest.fixture
async def api():
    system = SystemServer(host="127.0.0.1", port=0)
    port = await system.start()
    async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as client:
        yield system.loras, client
    await system.stop()


async def answer(client, method: str, path: str = "/v1/loras", body: object = None) -> tuple[int, dict]:
    async with client.request(method, path, json=body) as r:
        return r.status, await r.json()


async def test_not_ready_while_starting_on_a_follower_and_while_draining(api):
    lora, client = api
    status, body = await answer(client, "GET")
    assert (status, body["reason"]) == (503, "NotReady") and "starting" in body["message"]
    lora.enabled, lora.leader_only = True, 2
    status, body = await answer(client, "GET")
    assert (status, body["reason"]) == (503, "NotReady") and "leader (rank 0)" in body["message"]
    lora.leader_only, lora.draining = None, True
    status, body = await answer(client, "DELETE", "/v1/loras/a1")
    assert (status, body["reason"]) == (503, "NotReady") and "shutting down" in body["message"]


async def test_an_engine_past_the_bound_is_load_failed_and_nothing_is_listed(api, tmp_path):
    lora, client = api
    lora.manager = LoraManager(SlowEngine(delay_s=5), LoraLimits(), timeout_s=0.2)
    lora.enabled = True
    folder = write_adapter(TINY, tmp_path / "a1", rank=4)
    status, body = await answer(
        client, "POST", body={"lora_name": "a1", "source": {"uri": f"file://{folder}"}}
    )
    assert (status, body["reason"]) == (500, "LoadFailed") and "--lora-load-timeout-s" in body["message"]
    status, body = await answer(client, "GET")
    assert (status, body["count"]) == (200, 0)
    status, body = await answer(client, "POST", body={"lora_name": "a b"})
    assert (status, body["reason"]) == (400, "InvalidRequest")
