"""What the endpoint picker decides, served through a real Envoy: a disaggregated request's prefill and
decode legs on the pair it named (the mocker's decode leg completes only with the KV its prefill leg
put in their one bootstrap room), a LoRA adapter's requests only on workers that hold the adapter, and
routing headers a client sends never reach the frontend."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from tests.integration.epp.support import picks, scrape, served
from tests.integration.frontend.conftest import MODEL
from tests.integration.frontend.test_frontend_lora import LORA, load
from tests.support.metrics import metric
from tests.support.peft_adapters import write_adapter
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration


def client(gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=30)


async def test_disaggregated_requests_through_envoy_run_both_legs_on_the_pair_the_picker_named(
    mockers, frontend_factory, wait_workers, epp_factory, envoy
):
    prefill = [mockers("prefill", speedup=100.0) for _ in range(2)]
    decode = [mockers("decode", speedup=100.0) for _ in range(2)]
    fe = await frontend_factory(router_mode="direct", pair_warmup_timeout_s=0)  # no warm-up requests
    epp = await epp_factory([fe], router_mode="round-robin")
    for stack in (fe, epp):
        await wait_workers(stack, 4, mockers=prefill + decode)
    gateway = envoy(epp.grpc_port)
    async with client(gateway) as c:
        for i in range(4):
            r = await c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"disaggregated {i}"}], max_tokens=3
            )
            assert r.choices[0].message.content
    for role, ms in (("prefill", prefill), ("decode", decode)):
        for m in ms:
            chosen = await picks(epp, m.instance_id, role)
            assert chosen == 2 and served(m) == chosen, (role, m.instance_id, chosen, served(m))
    assert "dynamo_frontend_direct_fallbacks_total{" not in await scrape(fe.port)


async def test_adapter_requests_through_envoy_go_only_to_workers_holding_the_adapter(
    mockers, frontend_factory, wait_workers, epp_factory, envoy, tiny_model, tmp_path
):
    holder, other = mockers("null", *LORA, speedup=100.0), mockers("null", *LORA, speedup=100.0)
    fe = await frontend_factory(router_mode="direct")
    epp = await epp_factory([fe], router_mode="kv")
    for stack in (fe, epp):
        await wait_workers(stack, 2, mockers=[holder, other])
    await load(holder, "a1", write_adapter(tiny_model, tmp_path / "a1", rank=8, seed=1))
    for stack in (fe, epp):
        await wait_until_async(
            lambda s=stack: (e := s.registry.get("a1")) is not None and e.ready(), "a1 served", timeout_s=10
        )
    gateway = envoy(epp.grpc_port)
    async with client(gateway) as c:
        for i in range(6):
            r = await c.completions.create(model="a1", prompt=f"adapter prompt {i}", max_tokens=3)
            assert r.choices[0].text
    assert await picks(epp, holder.instance_id, model="a1") == 6
    assert await picks(epp, other.instance_id, model="a1") == 0
    assert served(holder) == 6 and served(other) == 0


async def test_routing_headers_a_client_sends_are_replaced_by_the_pickers(
    mockers, frontend_factory, wait_workers, epp_factory, envoy
):
    m = mockers("null", speedup=100.0)
    fe = await frontend_factory(router_mode="direct")
    epp = await epp_factory([fe], router_mode="kv")
    for stack in (fe, epp):
        await wait_workers(stack, 1, mockers=[m])
    gateway = envoy(epp.grpc_port)
    forged = {
        "x-dynamo-worker-instance-id": "forged-worker",
        "x-dynamo-prefill-instance-id": "forged-prefill",
        "x-gateway-destination-endpoint": "127.0.0.1:1",
    }
    async with client(gateway) as c:
        r = await c.completions.create(model=MODEL, prompt="hello", max_tokens=2, extra_headers=forged)
    assert r.choices[0].text
    assert "dynamo_frontend_direct_fallbacks_total{" not in await scrape(fe.port)
    assert served(m) == 1


async def test_a_direct_frontend_serves_an_unknown_worker_id_on_its_own_router_and_counts_it(
    mockers, frontend_factory, wait_workers
):
    m = mockers("null", speedup=100.0)
    fe = await frontend_factory(router_mode="direct")
    await wait_workers(fe, 1, mockers=[m])
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
    async with aiohttp.ClientSession() as s:
        for headers in ({"x-dynamo-worker-instance-id": "left-long-ago"}, {}):
            async with s.post(f"{fe.url}/v1/completions", json=body, headers=headers) as r:
                assert r.status == 200, await r.text()
    text = await scrape(fe.port)
    for reason in ("stale_worker", "no_pin"):
        labels = f'model="{MODEL}",reason="{reason}"'
        assert metric(text, "dynamo_frontend_direct_fallbacks_total", labels) == 1, reason
    assert served(m) == 2


async def test_a_stream_whose_named_worker_dies_migrates_to_another_worker(
    mockers, frontend_factory, wait_workers, epp_factory, envoy
):
    ms = [mockers("null", speedup=2.0) for _ in range(2)]
    fe = await frontend_factory(router_mode="direct")
    epp = await epp_factory([fe], router_mode="round-robin")
    for stack in (fe, epp):
        await wait_workers(stack, 2, mockers=ms)
    gateway = envoy(epp.grpc_port)
    chunks, usage, killed = 0, None, None
    async with client(gateway) as c:
        stream = await c.completions.create(
            model=MODEL,
            prompt="migrate me",
            max_tokens=60,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            chunks += 1
            usage = chunk.usage or usage
            if killed is None and chunks == 5:
                named = [m for m in ms if await picks(epp, m.instance_id) == 1]
                assert len(named) == 1
                killed = named[0]
                killed.kill()
    assert killed is not None and usage is not None
    assert usage.completion_tokens == 60  # the stream went on where it stopped
    survivor = next(m for m in ms if m is not killed)
    assert served(survivor) == 1  # the continuation, on the worker the frontend's own router chose
    migrations = metric(await scrape(fe.port), "dynamo_frontend_migrations_total", f'model="{MODEL}"')
    assert migrations == 1
