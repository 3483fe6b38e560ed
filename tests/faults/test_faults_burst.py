"""A 10x burst against a model's wait queue, and a model scaled to zero, through a frontend process and
a mocker worker with 4 slots (``--max-running-requests 4``).

Burst: 40 concurrent requests (10 x the slots), each allowed to wait 1 s (``x-llm-d-inference-ttl``),
with ``--max-queued-requests 8``: 4 run, 8 wait, the rest are refused with 429 + ``Retry-After`` at
once; a waiter a slot frees for in time runs, the others are answered 503 + ``Retry-After`` at their
deadline. Every request gets one of these three answers: none lost (no connection error, no hang, no
other status), and the queue never holds more than its bound.

Scaled to zero: the only worker stops; a request is held (the model stays listed) and answered once a
worker registers again.

Bounds:
- ``REFUSAL_BOUND_S`` 2 s: a request refused at a full queue gets its 429 without waiting (40
  connections opened at once by one client on 2 busy cores).
- ``LATENESS_BOUND_S`` 1 s: an expired waiter is answered within 1 s after its deadline (timers on
  the frontend's event loop, which streams 4 requests meanwhile).
- ``WAKE_BOUND_S`` 5 s: a held request is answered within 5 s after the worker process starts
  (its start-up, registration, the discovery watch, one request).
"""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp
import pytest

from tests.faults.frontend_proc import start_frontend
from tests.faults.test_faults_workers import MESSAGES, MODEL
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

SLOTS = 4
QUEUE = 8
OFFERED = 10 * SLOTS
TTL_S = 1.0
REFUSAL_BOUND_S = 2.0
LATENESS_BOUND_S = 1.0
WAKE_BOUND_S = 5.0


def _gauge(text: str, name: str) -> float:
    found = re.search(rf'^{name}\{{model="{MODEL}"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


async def test_a_ten_times_burst_is_queued_refused_or_expired_never_lost(
    mockers, nats_url, namespace, tmp_path, fault_row
):
    full = fault_row(
        "burst 10x: queue full",
        f"{OFFERED} concurrent requests, {SLOTS} slots, --max-queued-requests {QUEUE}: 429 + Retry-After",
        REFUSAL_BOUND_S,
    )
    expired = fault_row(
        "burst 10x: deadline",
        f"the same burst, x-llm-d-inference-ttl {TTL_S:g}s: waiters answered 503 + Retry-After at it",
        LATENESS_BOUND_S,
    )
    m = mockers("null", "--max-running-requests", str(SLOTS), speedup=1.0)
    fe = start_frontend(tmp_path / "frontend.log", namespace, nats_url, "--max-queued-requests", str(QUEUE))
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
    deepest = 0.0
    try:
        await asyncio.to_thread(fe.wait_serving)
        assert m.proc.poll() is None
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 100, "ignore_eos": True}
        headers = {"x-llm-d-inference-ttl": f"{TTL_S:g}s"}

        async def one() -> tuple[str, float]:
            started = time.monotonic()
            try:
                async with session.post(fe.url + "/v1/chat/completions", json=body, headers=headers) as r:
                    data = await r.json()
                    retry = r.headers.get("Retry-After") is not None
            except (aiohttp.ClientError, TimeoutError) as e:
                return f"lost:{e!r}", time.monotonic() - started
            elapsed = time.monotonic() - started
            if r.status == 200 and data["choices"][0]["finish_reason"] == "length":
                return "done", elapsed
            code = (data.get("error") or {}).get("code")
            if r.status == 429 and retry and code == "queue_full":
                return "refused", elapsed
            if r.status == 503 and retry and code == "queue_timeout":
                return "expired", elapsed
            return f"lost:{r.status}:{code}", elapsed

        burst = asyncio.gather(*(one() for _ in range(OFFERED)))
        while not burst.done():
            _, text = await asyncio.to_thread(fe.get, "/metrics")
            deepest = max(deepest, _gauge(text, "dynamo_frontend_queued_requests"))
            await asyncio.sleep(0.05)
        outcomes = burst.result()
    finally:
        await session.close()
        fe.stop()
    kinds = [kind for kind, _ in outcomes]
    lost = [k for k in kinds if k.startswith("lost")]
    full.lost = expired.lost = len(lost)
    assert not lost, lost
    done, refused = kinds.count("done"), [t for k, t in outcomes if k == "refused"]
    late = [t - TTL_S for k, t in outcomes if k == "expired"]
    assert done >= SLOTS and refused and late, (done, len(refused), len(late))
    assert deepest <= QUEUE, deepest
    full.answered(max(refused))
    full.done += f" ({len(refused)} refused, {done} served, queue at most {deepest:g})"
    expired.answered(max(max(late), 0.0))
    expired.done += f" ({len(late)} expired)"
    assert min(late) >= -0.05, "a waiter was answered before its deadline"
    assert full.within_bound(), f"a refusal took {max(refused):.2f}s"
    assert expired.within_bound(), f"an expired waiter was answered {max(late):.2f}s after its deadline"


async def test_a_model_scaled_to_zero_holds_its_request_until_a_worker_registers(
    mockers, nats_url, namespace, tmp_path, fault_row
):
    row = fault_row(
        "scaled to zero",
        "stop the only worker; a request is held (model still listed); start a worker: answered",
        WAKE_BOUND_S,
    )
    first = mockers("null")
    fe = start_frontend(tmp_path / "frontend.log", namespace, nats_url)
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
    try:
        await asyncio.to_thread(fe.wait_serving)
        first.stop()
        agg = re.compile(rf'^dynamo_frontend_workers\{{model="{MODEL}",role="agg"\}} 0\.0$', re.M)
        await asyncio.to_thread(
            wait_until, lambda: agg.search(fe.get("/metrics")[1]), "the worker to leave", timeout_s=30
        )
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4}
        held = asyncio.create_task(session.post(fe.url + "/v1/chat/completions", json=body))
        await asyncio.to_thread(
            wait_until,
            lambda: _gauge(fe.get("/metrics")[1], "dynamo_frontend_queued_requests") == 1,
            "the request to be held",
            timeout_s=30,
        )
        assert MODEL in fe.get("/v1/models")[1]
        started = time.monotonic()
        mockers("null")
        response = await asyncio.wait_for(held, 60)
        status = response.status
        await response.read()
        row.answered(time.monotonic() - started)
    finally:
        await session.close()
        fe.stop()
    row.lost = 0 if status == 200 else 1
    assert status == 200
    assert row.within_bound(), f"answered {row.observed_s:.2f}s after the worker started"
