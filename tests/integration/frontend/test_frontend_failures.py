"""Failures end to end (real nats-server, real mocker processes, the official ``openai`` client): a
worker killed mid-stream gives the client an error (not a hang); a client that disconnects makes the
worker cancel the request; a worker killed while discovery still lists it is skipped for another."""

from __future__ import annotations

import asyncio
import re

import openai
import pytest

from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "Tell me a long story."}]
BOUND_S = 30.0  # every failure must surface well within this


def client(fe) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0, timeout=BOUND_S)


def counter(metrics: str, outcome: str) -> float:
    m = re.search(r'^dynamo_worker_requests_total\{outcome="' + outcome + r'"\} (\S+)$', metrics, re.M)
    return float(m.group(1)) if m else 0.0


async def test_worker_killed_mid_stream_errors_not_hangs(mockers, frontend_factory, wait_workers):
    m = mockers("null", speedup=1.0)
    fe = await frontend_factory()
    await wait_workers(fe, 1, mockers=[m])
    async with client(fe) as c:
        stream = await c.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2000, stream=True, extra_body={"ignore_eos": True}
        )
        received = 0
        with pytest.raises(openai.APIError) as e:
            async with asyncio.timeout(BOUND_S):
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        received += 1
                        if received == 3:
                            m.kill()
        assert received >= 3
        assert "worker" in str(e.value.message).lower()


async def test_client_disconnect_cancels_on_worker(mockers, frontend_factory, wait_workers):
    m = mockers("null", speedup=1.0)
    fe = await frontend_factory()
    await wait_workers(fe, 1, mockers=[m])
    before = counter(m.metrics(), "cancelled")
    async with client(fe) as c:
        stream = await c.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2000, stream=True, extra_body={"ignore_eos": True}
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        await stream.close()
    await wait_until_async(
        lambda: counter(m.metrics(), "cancelled") > before,
        "the worker to see the cancellation",
        timeout_s=BOUND_S,
        interval_s=0.1,
    )
    assert fe.server is not None
    await wait_until_async(
        lambda: not fe.server.inflight, "the frontend to end the request", timeout_s=BOUND_S, interval_s=0.05
    )


async def test_dead_worker_still_in_discovery_is_skipped(mockers, frontend_factory, wait_workers):
    a, b = mockers("null"), mockers("null")
    fe = await frontend_factory()
    await wait_workers(fe, 2, mockers=[a, b])
    a.kill()  # its record lives until the TTL expires; requests must still succeed
    async with client(fe) as c:
        for _ in range(4):
            r = await c.completions.create(model=MODEL, prompt="hi", max_tokens=3)
            assert r.choices[0].finish_reason in ("length", "stop")


async def test_models_disappear_when_their_worker_leaves(mockers, frontend_factory, wait_workers):
    """With --model-retention-s 0 (the default keeps the model listed and held for: see
    test_frontend_admission), a model goes with its last worker and its requests get 503 at once."""
    m = mockers("null")
    fe = await frontend_factory(model_retention_s=0.0)
    await wait_workers(fe, 1, mockers=[m])
    async with client(fe) as c:
        assert [x.id for x in (await c.models.list()).data] == [MODEL]
        m.stop()  # graceful: deregisters first

        async def unlisted() -> bool:
            return not (await c.models.list()).data

        await wait_until_async(
            unlisted, "the model to leave the list with its worker", timeout_s=BOUND_S, interval_s=0.05
        )
        with pytest.raises(openai.APIStatusError) as e:
            await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
        assert e.value.status_code == 503 and e.value.body["code"] == "no_workers"
