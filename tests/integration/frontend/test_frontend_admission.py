"""Overload and scale from zero through the real stack (frontend, nats-server, mocker processes, the
official openai client, no retries): a model's requests beyond its workers' slots wait, a full queue is
a 429 at once and a waiter past its deadline (``x-llm-d-inference-ttl``) a 503 with ``Retry-After``
at that deadline; a model whose last worker left stays in ``/v1/models``, its requests are held and
served once a worker registers again (or answered 503 "scaling up" at their deadline); a graph's model
(``--graph-models``) is listed and held for before any worker ever registered, and its frontend is not
ready while it loads the model card of its first worker; the queue metrics say all of it."""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp
import openai
import pytest
from dynamo_worker.frontend.models.preprocessor import Preprocessor

from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

MODEL = "tiny"
SLOW = ("--max-running-requests", "1")  # one slot


def client(fe) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0, timeout=60)


async def metric(fe, name: str, **labels: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(fe.url + "/metrics") as r:
        text = await r.text()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    found = re.search(rf"^{name}\{{{re.escape(want)}\}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


async def models(fe) -> list[str]:
    async with client(fe) as c:
        return [m.id async for m in c.models.list()]


async def test_a_saturated_model_queues_refuses_and_expires(mockers, frontend_factory, wait_workers):
    m = mockers("null", *SLOW, speedup=1.0)
    fe = await frontend_factory(max_queued_requests=1, queue_ttl_s=60.0)
    await wait_workers(fe, 1, mockers=[m])
    async with client(fe) as c:
        # the one slot: a long stream that holds it
        long = await c.completions.create(
            model=MODEL, prompt="hello", max_tokens=400, stream=True, extra_body={"ignore_eos": True}
        )
        first = await anext(aiter(long))
        assert first.choices
        # the next one waits, with a deadline of its own
        t0 = time.monotonic()
        waiting = asyncio.create_task(
            c.completions.create(
                model=MODEL, prompt="hi", max_tokens=4, extra_headers={"x-llm-d-inference-ttl": "1500ms"}
            )
        )
        await wait_until_async(
            lambda: metric(fe, "dynamo_frontend_queued_requests", model=MODEL),
            "the second request to wait",
            timeout_s=10,
        )
        # the queue (1) is full: the third is refused at once
        with pytest.raises(openai.RateLimitError) as refused:
            await c.completions.create(model=MODEL, prompt="hi", max_tokens=4)
        assert refused.value.response.headers["retry-after"] == "1"
        assert refused.value.response.headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
        assert refused.value.body["code"] == "queue_full"
        # the waiting one is answered at its deadline, not before
        with pytest.raises(openai.InternalServerError) as expired:
            await waiting
        waited = time.monotonic() - t0
        assert expired.value.status_code == 503 and expired.value.body["code"] == "queue_timeout"
        assert expired.value.response.headers["retry-after"] == "1"
        assert 1.5 <= waited < 30
        await long.close()
    assert await metric(fe, "dynamo_frontend_queue_rejected_total", model=MODEL, reason="queue_full") == 1
    assert await metric(fe, "dynamo_frontend_queue_expired_total", model=MODEL, reason="deadline") == 1
    assert await metric(fe, "dynamo_frontend_queued_requests", model=MODEL) == 0


async def test_a_model_whose_workers_left_is_held_for_and_served_when_one_returns(
    mockers, frontend_factory, wait_workers
):
    first = mockers("null")
    fe = await frontend_factory()  # the defaults: retained 10 min, held 5 min
    await wait_workers(fe, 1, mockers=[first])
    first.stop()  # SIGTERM: it deregisters
    assert fe.registry is not None
    await wait_until_async(lambda: not fe.registry.served(), "the worker to leave", timeout_s=20)
    assert await models(fe) == [MODEL]
    async with aiohttp.ClientSession() as http, http.get(fe.url + "/health") as r:
        assert r.status == 200  # listed: the frontend stays in its Service while the model scales up
    async with client(fe) as c:
        # a deadline shorter than the hold: answered 503 "scaling up" then
        with pytest.raises(openai.InternalServerError) as e:
            await c.completions.create(
                model=MODEL, prompt="hi", max_tokens=4, extra_headers={"x-llm-d-inference-ttl": "1s"}
            )
        assert e.value.body["code"] == "model_scaling_up" and "scaling up" in e.value.body["message"]
        assert e.value.response.headers["retry-after"] == "5"
        # held until a worker registers again, then answered
        arrived = time.monotonic()
        held = asyncio.create_task(c.completions.create(model=MODEL, prompt="hi", max_tokens=4))
        await wait_until_async(
            lambda: metric(fe, "dynamo_frontend_queued_requests", model=MODEL),
            "the request to be held (the demand a planner reads)",
            timeout_s=10,
        )
        mockers("null")
        out = await asyncio.wait_for(held, 60)
        latency = time.monotonic() - arrived
        assert out.choices[0].finish_reason in ("length", "stop")
    print(f"\nscale from zero on the mocker: request arrival to answer {latency:.2f}s (worker process start)")
    assert await metric(fe, "dynamo_frontend_queue_expired_total", model=MODEL, reason="scaling_up") == 1


async def test_a_graph_model_is_listed_and_held_for_before_any_worker(mockers, frontend_factory):
    fe = await frontend_factory(graph_models=MODEL)
    assert await models(fe) == [MODEL]
    async with client(fe) as c:
        held = asyncio.create_task(
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        )
        await wait_until_async(
            lambda: metric(fe, "dynamo_frontend_queued_requests", model=MODEL),
            "the request to be held",
            timeout_s=10,
        )
        with pytest.raises(openai.NotFoundError):  # a model the graph does not serve is still a 404
            await c.completions.create(model="other", prompt="hi", max_tokens=4)
        mockers("null")
        out = await asyncio.wait_for(held, 60)
        assert out.choices[0].message.content is not None


async def test_a_graph_model_is_not_ready_while_its_first_card_loads_so_a_request_at_ready_is_not_held(
    mockers, frontend_factory, monkeypatch
):
    """``/health`` is what dynamo-run's Ready and a pod's readiness read. A graph model keeps it 200
    before any worker, but from its first worker's registration until its tokenizer has loaded a
    request would be held: that window is 503, with the reason. The load is slowed by a second here (a
    sleep before the real ``Preprocessor.from_dir``), as a large tokenizer is on a GPU host (0.3-0.45 s
    for the 128k-word one of tests/gpu, which held a fresh aggregated graph's first chat 0.3 s)."""
    load = Preprocessor.from_dir

    def slow_load(*args, **kwargs):
        time.sleep(1.0)
        return load(*args, **kwargs)

    monkeypatch.setattr(Preprocessor, "from_dir", slow_load)
    fe = await frontend_factory(graph_models=MODEL)
    assert (await health(fe))[0] == 200  # listed, and held for, before any worker
    m = mockers("null")
    await wait_until_async(
        lambda: fe.registry.get(MODEL) is not None and fe.registry.get(MODEL).workers,
        "the frontend to see the worker",
        timeout_s=60,
    )
    status, body = await health(fe)
    assert status == 503, body
    assert body["reason"].startswith(f"loading the model card (tokenizer, chat template) of {MODEL}")
    assert "--model-load-timeout-s" in body["reason"]
    await wait_until_async(lambda: health_status(fe, 200), "/health ready once the card loaded", timeout_s=30)
    async with client(fe) as c:
        out = await c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert out.choices[0].message.content is not None
    assert await metric(fe, "dynamo_frontend_queue_wait_seconds_count", model=MODEL) == 1
    assert await metric(fe, "dynamo_frontend_queue_wait_seconds_sum", model=MODEL) == 0.0, "it was held"
    assert m.proc.poll() is None


async def health(fe) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http, http.get(fe.url + "/health") as r:
        return r.status, await r.json()


async def health_status(fe, want: int) -> bool:
    return (await health(fe))[0] == want
