"""Overload: ten times ``--max-inflight`` concurrent streams against a frontend process. The requests
beyond the limit are answered at once with 503 and ``Retry-After`` (never queued without bound, never
dropped), the ones admitted complete, and the frontend's resident memory stays bounded.

Bounds:
- ``REFUSAL_BOUND_S`` 5 s: a refused request gets its 503 without waiting for a slot (a counter check
  before any work). The time is the client's: 80 connections opened at once by one process, on 2 cores
  that CI shares with two more test processes and a background build (2.1 s seen there; under 0.1 s on
  an idle machine). A request queued instead of refused is caught by the count of refusals, not by time.
- ``RSS_GROWTH_BOUND`` 32 MiB: peak resident memory under 10x load minus resident memory after a run at
  1x load. What is refused costs a parsed HTTP request and an error body, so the growth is a few MiB;
  32 MiB catches a queue (or buffers) that grows with offered load.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.faults.frontend_proc import start_frontend
from tests.faults.test_faults_workers import MESSAGES, MODEL

pytestmark = pytest.mark.integration

MAX_INFLIGHT = 8
OFFERED = 10 * MAX_INFLIGHT
REFUSAL_BOUND_S = 5.0
RSS_GROWTH_BOUND = 32 * 2**20


async def test_ten_times_max_inflight_is_refused_with_retry_after_in_bounded_memory(
    mockers, nats_url, namespace, tmp_path, fault_row
):
    row = fault_row(
        "overload",
        f"{OFFERED} concurrent streams, --max-inflight {MAX_INFLIGHT}: 503 + Retry-After, memory bounded",
        REFUSAL_BOUND_S,
    )
    m = mockers("null", speedup=1.0)
    fe = start_frontend(tmp_path / "frontend.log", namespace, nats_url, "--max-inflight", str(MAX_INFLIGHT))
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
    try:
        await asyncio.to_thread(fe.wait_serving)
        assert m.proc.poll() is None
        # raw aiohttp, not the openai client: its request preparation costs 10-20 ms of CPU per request
        # (tests/gpu/README.md), which for 80 requests from one process would be timed as refusal time
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 100, "stream": True, "ignore_eos": True}

        async def one() -> tuple[str, float]:
            started = time.monotonic()
            async with session.post(fe.url + "/v1/chat/completions", json=body) as r:
                if r.status != 200:
                    await r.read()
                    kind = "503+retry" if r.status == 503 and r.headers.get("Retry-After") else "other"
                    return f"{kind}:{r.status}", time.monotonic() - started
                text = (await r.read()).decode()
                done = text.rstrip().endswith("data: [DONE]") and '"content"' in text
                return ("done" if done else "broken"), time.monotonic() - started

        warm = await asyncio.gather(*(one() for _ in range(MAX_INFLIGHT)))
        assert all(kind == "done" for kind, _ in warm), warm
        baseline = fe.rss_bytes()
        peak = baseline
        results = asyncio.gather(*(one() for _ in range(OFFERED)))
        while not results.done():
            peak = max(peak, fe.rss_bytes())
            await asyncio.sleep(0.02)
        outcomes = results.result()
    finally:
        await session.close()
        fe.stop()
    done = [t for kind, t in outcomes if kind == "done"]
    refused = [t for kind, t in outcomes if kind == "503+retry:503"]
    row.lost = len(outcomes) - len(done) - len(refused)
    assert row.lost == 0, sorted({kind for kind, _ in outcomes})
    assert len(done) >= MAX_INFLIGHT and len(refused) >= OFFERED // 2, (len(done), len(refused))
    row.answered(max(refused))
    growth = peak - baseline
    row.done += f" (RSS +{growth / 2**20:.1f} MiB)"
    assert growth < RSS_GROWTH_BOUND, f"resident memory grew {growth / 2**20:.1f} MiB under overload"
    assert row.within_bound(), f"a refusal took {max(refused):.2f}s"
