"""Warm pairs with real mocker workers (``--kv-first-transfer-s``: the first KV transfer of a new
prefill/decode pair opens its connection, seconds on GPUs): the frontend's /health turns ready only once
a warm-up request went through a pair, so the first user request sent then does not pay for it, as it
does with warm-ups off; user requests stay on warm pairs while a new pair still warms; a warm-up that
runs out is logged as an error, does not hold /health, and its pair gets traffic only when no warm one
is left; a model whose only pair cannot warm is ready at the bound, and the log says so."""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp
import openai
import pytest

from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

MODEL = "tiny"
SPEEDUP = 50.0
OPENING = "Opening the KV transfer connection to a new prefill engine"


def slow_first_transfer(seconds: float) -> tuple[str, ...]:
    """Mocker flags: the first transfer from a prefill engine costs ``seconds`` of real time."""
    return ("--kv-first-transfer-s", str(seconds * SPEEDUP))


def served(metrics: str) -> float:
    found = re.findall(r'^dynamo_worker_requests_total\{outcome="(?:length|stop)"\} (\S+)$', metrics, re.M)
    return sum(float(n) for n in found)


async def health(fe) -> int:
    async with aiohttp.ClientSession() as http, http.get(fe.url + "/health") as r:
        return r.status


async def healthy(fe) -> bool:
    return await health(fe) == 200


async def ttft(fe) -> float:
    """Seconds to the first streamed token of a short completion."""
    async with openai.AsyncOpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=60) as c:
        started = time.monotonic()
        stream = await c.completions.create(
            model=MODEL, prompt="hello there", max_tokens=4, stream=True, extra_body={"ignore_eos": True}
        )
        first = None
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].text:
                first = time.monotonic() - started
        assert first is not None
        return first


async def test_ready_waits_for_a_warm_pair_so_the_first_request_does_not_open_the_connection(
    mockers, frontend_factory, wait_workers
):
    p = mockers("prefill", *slow_first_transfer(2.0), speedup=SPEEDUP)
    d = mockers("decode", *slow_first_transfer(2.0), speedup=SPEEDUP)
    fe = await frontend_factory()
    await wait_workers(fe, 2, mockers=[p, d])
    # /health is 503 while the pair warms up (its connection takes 2 s), then 200
    await wait_until_async(lambda: healthy(fe), "the frontend's /health to turn ready", timeout_s=30)
    assert d.log().count(OPENING) == 1, "the warm-up opened the pair's connection before Ready"
    assert fe.warmer is not None and fe.warmer.warm_count() == 1
    first = await ttft(fe)
    assert first < 1.0, f"the first request at Ready took {first:.2f}s: it waited for the connection"
    assert d.log().count(OPENING) == 1


async def test_without_warm_ups_the_first_request_pays_for_the_connection(
    mockers, frontend_factory, wait_workers
):
    p = mockers("prefill", *slow_first_transfer(2.0), speedup=SPEEDUP)
    d = mockers("decode", *slow_first_transfer(2.0), speedup=SPEEDUP)
    fe = await frontend_factory(pair_warmup_timeout_s=0)
    await wait_workers(fe, 2, mockers=[p, d])
    assert await health(fe) == 200  # nothing to wait for
    assert await ttft(fe) >= 2.0
    assert d.log().count(OPENING) == 1


async def test_requests_stay_on_warm_pairs_and_a_warm_up_that_runs_out_is_said_and_holds_nothing(
    mockers, frontend_factory, wait_workers, caplog
):
    """Decode worker ``slow`` needs 20 s to open a connection, longer than the 1 s warm-up bound: its
    warm-up fails loudly, /health does not wait for it, and requests go to the warm pair only."""
    p = mockers("prefill", speedup=SPEEDUP)
    fast = mockers("decode", *slow_first_transfer(0.0), speedup=SPEEDUP)
    slow = mockers("decode", *slow_first_transfer(20.0), speedup=SPEEDUP)
    fe = await frontend_factory(pair_warmup_timeout_s=1.0)
    await wait_workers(fe, 3, mockers=[p, fast, slow])
    await wait_until_async(lambda: healthy(fe), "/health ready", timeout_s=30)
    async with openai.AsyncOpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=30) as c:
        answers = await asyncio.gather(
            *(c.completions.create(model=MODEL, prompt=f"hello {i}", max_tokens=3) for i in range(6))
        )
    assert all(a.choices[0].finish_reason in ("length", "stop") for a in answers)
    await wait_until_async(
        lambda: "Could not warm prefill/decode pair" in caplog.text,
        "the failed warm-up to be logged",
        timeout_s=10,
    )
    assert "--pair-warmup-timeout-s" in caplog.text
    await wait_until_async(
        lambda: served(fast.metrics()) == 6 + 1, "the warm pair to serve every request", timeout_s=10
    )
    assert served(slow.metrics()) == 0


async def test_a_model_whose_only_pair_cannot_warm_is_ready_at_the_bound_and_says_so(
    mockers, frontend_factory, wait_workers, caplog
):
    """Readiness waits for a warm pair at most --pair-warmup-timeout-s: then the model serves on its cold
    pair, and the frontend's log says that no pair could be warmed."""
    p = mockers("prefill", speedup=SPEEDUP)
    d = mockers("decode", *slow_first_transfer(20.0), speedup=SPEEDUP)
    fe = await frontend_factory(pair_warmup_timeout_s=1.0)
    await wait_workers(fe, 2, mockers=[p, d])
    await wait_until_async(lambda: healthy(fe), "/health ready past the warm-up bound", timeout_s=30)
    assert "No prefill/decode pair of model=tiny could be warmed" in caplog.text
    assert fe.warmer is not None and fe.warmer.warm_count() == 0 and fe.warmer.starting() == []
