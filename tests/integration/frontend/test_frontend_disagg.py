"""Disaggregated serving end to end: with 1 prefill + 1 decode mocker the frontend sends both legs
concurrently with one bootstrap room and streams the decode leg; when the prefill leg fails the decode
leg is cancelled and the client gets an error in bounded time; with only decode workers left a request
waits for a prefill worker, and gets a 503 naming the missing prefill workers when none comes (never a
silent decode-only request); a killed prefill or
decode worker that discovery still lists is skipped for another worker of its role; the decode leg is
written before the prefill leg."""

from __future__ import annotations

import asyncio
import json
import re
import time

import openai
import pytest
from dynamo_worker.runtime.request_plane import client as request_plane

from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
BOUND_S = 30.0


def client(fe) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0, timeout=BOUND_S)


def counter(metrics: str, outcome: str) -> float:
    m = re.search(r'^dynamo_worker_requests_total\{outcome="' + outcome + r'"\} (\S+)$', metrics, re.M)
    return float(m.group(1)) if m else 0.0


def inflight(metrics: str) -> float:
    m = re.search(r"^dynamo_worker_inflight_requests (\S+)$", metrics, re.M)
    return float(m.group(1)) if m else 0.0


async def test_disaggregated_request_streams_decode_leg(mockers, frontend_factory, wait_workers, wait_warm):
    p, d = mockers("prefill"), mockers("decode")
    fe = await frontend_factory()
    await wait_workers(fe, 2, mockers=[p, d])
    await wait_warm(fe, 1)  # the frontend's warm-up request: one more on each worker
    async with client(fe) as c:
        whole = await c.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=8, seed=1, extra_body={"ignore_eos": True}
        )
        assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 8
        stream = await c.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=8, seed=1, stream=True, extra_body={"ignore_eos": True}
        )
        text = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
        assert text == whole.choices[0].message.content

    # each leg counts its request when it ends there, which may be just after the client's last token
    def legs() -> tuple[float, float]:
        return counter(p.metrics(), "length") + counter(p.metrics(), "stop"), counter(d.metrics(), "length")

    await wait_until_async(
        lambda: legs() == (3, 3),
        "both legs to count 2 requests and the warm-up",
        timeout_s=BOUND_S,
        interval_s=0.1,
        explain=lambda: f"(prefill, decode) counted {legs()}",
    )


async def test_prefill_leg_failure_cancels_decode_and_errors(
    mockers, frontend_factory, wait_workers, wait_warm
):
    p, d = mockers("prefill"), mockers("decode", "--bootstrap-timeout-s", "120")
    fe = await frontend_factory()
    await wait_workers(fe, 2, mockers=[p, d])
    await wait_warm(fe, 1)
    p.kill()  # still in discovery until its TTL expires: the prefill leg cannot connect
    started = time.monotonic()
    async with client(fe) as c:
        with pytest.raises(openai.APIStatusError) as e:
            await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8)
    # the only prefill worker is quarantined at once: 503 naming the role, never a 502
    assert e.value.status_code == 503 and "No live prefill worker" in e.value.message
    assert time.monotonic() - started < BOUND_S
    # the decode leg (if it reached the worker at all) is cancelled, not left waiting for its peer
    # until the decode worker's own 120 s bootstrap timeout
    await wait_until_async(
        lambda: inflight(d.metrics()) == 0, "the decode leg to end", timeout_s=BOUND_S, interval_s=0.1
    )
    assert counter(d.metrics(), "length") == 1  # the warm-up only


async def test_decode_only_left_is_503(mockers, frontend_factory, wait_workers, wait_warm):
    """The model was served, so its requests are held for a prefill worker to come back (bounded here
    to 1 s); then the 503 names what is missing. Never a request to a decode worker alone."""
    p, d = mockers("prefill", "--discovery-ttl", "2"), mockers("decode")
    fe = await frontend_factory(scale_up_timeout_s=1.0)
    await wait_workers(fe, 2, mockers=[p, d])
    await wait_warm(fe, 1)  # the warm-up: one request the decode worker counts
    p.stop()  # graceful: deregisters at once
    assert fe.registry is not None
    await wait_until_async(
        lambda: not fe.registry.get(MODEL).by_role("prefill"),
        "the prefill worker to leave the registry",
        timeout_s=BOUND_S,
        interval_s=0.05,
    )
    async with client(fe) as c:
        with pytest.raises(openai.APIStatusError) as e:
            await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
    assert e.value.status_code == 503 and e.value.body["code"] == "model_scaling_up"
    assert "1 decode worker(s) but no prefill worker" in e.value.body["message"]
    assert sum(counter(d.metrics(), o) for o in ("length", "stop", "cancelled", "error")) == 1


async def test_decode_killed_mid_stream_errors_not_hangs(mockers, frontend_factory, wait_workers):
    p, d = mockers("prefill"), mockers("decode", speedup=1.0)
    fe = await frontend_factory()
    await wait_workers(fe, 2, mockers=[p, d])
    async with client(fe) as c:
        stream = await c.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2000, stream=True, extra_body={"ignore_eos": True}
        )
        received = 0
        with pytest.raises(openai.APIError):
            async with asyncio.timeout(BOUND_S):
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        received += 1
                        if received == 3:
                            d.kill()
        assert received >= 3
    assert fe.server is not None
    await wait_until_async(
        lambda: not fe.server.inflight, "the frontend to end the request", timeout_s=BOUND_S, interval_s=0.05
    )


async def test_dead_decode_worker_still_in_discovery_is_skipped(
    mockers, frontend_factory, wait_workers, wait_warm
):
    p, d1, d2 = mockers("prefill"), mockers("decode"), mockers("decode")
    fe = await frontend_factory()
    await wait_workers(fe, 3, mockers=[p, d1, d2])
    await wait_warm(fe, 2)
    d1.kill()  # its record lives until the TTL expires; requests must go to the other decode worker
    async with client(fe) as c:
        for _ in range(4):
            r = await c.completions.create(model=MODEL, prompt="hi", max_tokens=3)
            assert r.choices[0].finish_reason in ("length", "stop")
    assert counter(d2.metrics(), "length") + counter(d2.metrics(), "stop") == 4 + 1  # and the warm-up


async def test_dead_prefill_worker_still_in_discovery_is_skipped(mockers, frontend_factory, wait_workers):
    p1, p2, d = mockers("prefill"), mockers("prefill"), mockers("decode")
    fe = await frontend_factory()
    await wait_workers(fe, 3, mockers=[p1, p2, d])
    p1.kill()
    async with client(fe) as c:
        for _ in range(4):
            r = await c.completions.create(model=MODEL, prompt="hi", max_tokens=3)
            assert r.choices[0].finish_reason in ("length", "stop")


async def test_decode_leg_is_sent_before_the_prefill_leg(
    mockers, frontend_factory, wait_workers, wait_warm, monkeypatch
):
    """SGLang's prefill engine holds a request in its bootstrap queue until the decode engine's handshake
    for it arrives, so the decode leg is written to its worker first. Observed with a spy on the real
    request plane's write (the in-process frontend's connection), the workers and transfers real."""
    p, d = mockers("prefill"), mockers("decode")
    fe = await frontend_factory()
    await wait_workers(fe, 2, mockers=[p, d])
    await wait_warm(fe, 1)
    written: list[str] = []
    real_open = request_plane._ClientConnection.open

    def spy(self, request: bytes):
        written.append(json.loads(request)["request_id"])
        return real_open(self, request)

    monkeypatch.setattr(request_plane._ClientConnection, "open", spy)
    async with client(fe) as c:
        for _ in range(3):
            answer = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
            assert answer.usage.completion_tokens == 4
    assert len(written) == 6, written
    for decode_id, prefill_id in zip(written[::2], written[1::2], strict=True):
        assert prefill_id == f"{decode_id}-prefill", written
