"""Worker faults, end to end: real mocker worker processes killed with SIGKILL, the real frontend,
the official ``openai`` client. Each test is one row of the fault table.

Bounds (what a user is promised; generous for a loaded 2-core machine, yet each well under what the
failure would cost without the mechanism under test):
- ``ERROR_BOUND_S`` 1 s: a worker SIGKILLed mid-stream with migration off ends the stream with an error
  event, and a role with no live worker answers 503: both need only the kernel's connection reset and
  no timer, so a second is ample even on 2 busy cores (without quarantine the dead worker stays
  routable for the discovery TTL, 10 s).
- ``MIGRATION_STALL_BOUND_S`` 5 s: the longest pause the client sees while its stream moves to another
  worker (a new connection and the prefill of prompt + streamed tokens on the simulated engine).
- ``FIRST_TOKEN_ERROR_BOUND_S`` 3 s: a prefill worker lost mid-transfer ends the request (never
  SGLang's 300 s bootstrap wait, never the frontend's first-token bound).
- ``CANCEL_BOUND_S`` 3 s: a client gone before the first token frees both legs on both workers.
- ``KV_TRANSFER_TIMEOUT_S`` 2 s (the frontend's ``--kv-transfer-timeout-s``, 60 s by default) plus
  ``CANCEL_BOUND_S``: a KV transfer that never completes while both workers stay alive ends the request
  at the bound (retried on another pair when there is one), and both legs are cancelled on their workers.
"""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from tests.support.metrics import metric
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "Tell me a long story."}]
ERROR_BOUND_S = 1.0
MIGRATION_STALL_BOUND_S = 5.0
FIRST_TOKEN_ERROR_BOUND_S = 3.0
CANCEL_BOUND_S = 3.0
KV_TRANSFER_TIMEOUT_S = 2.0
WAIT_S = 30.0  # a deadline on every poll below, far above any bound


def client(fe) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0, timeout=WAIT_S)


def _frontend_metrics(fe) -> str:
    from prometheus_client import generate_latest

    return generate_latest(fe.metrics.registry).decode()


def inflight(m) -> float:
    return metric(m.metrics(), "dynamo_worker_inflight_requests")


def cancelled(m) -> float:
    return metric(m.metrics(), "dynamo_worker_requests_total", 'outcome="cancelled"')


async def until(predicate, what: str, within_s: float = WAIT_S) -> float:
    """Poll ``predicate`` every 20 ms; returns the seconds it took, or fails naming ``what``."""
    started = time.monotonic()
    await wait_until_async(predicate, what, timeout_s=within_s, interval_s=0.02)
    return time.monotonic() - started


async def stream_and_kill(c, mockers_list, max_tokens: int, kill_after: int):
    """Stream a chat completion; after ``kill_after`` content chunks SIGKILL the worker serving it.
    Returns (content chunks, usage or None, finish reason, stall, error or None): ``stall`` is the
    longest the client waited for its next event after the kill (the error event, or the next token
    across a migration), measured from the kill itself and then between events."""
    stream = await c.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks, usage, finish, error = 0, None, None, None
    last: float | None = None  # time of the kill, then of each event after it
    stall = 0.0
    try:
        async with asyncio.timeout(WAIT_S):
            async for chunk in stream:
                if last is not None:
                    now = time.monotonic()
                    stall, last = max(stall, now - last), now
                if chunk.usage is not None:
                    usage = chunk.usage
                if chunk.choices:
                    finish = chunk.choices[0].finish_reason or finish
                    if chunk.choices[0].delta.content:
                        chunks += 1
                        if chunks == kill_after:
                            serving = [m for m in mockers_list if inflight(m) > 0]
                            assert len(serving) == 1, "exactly one worker serves the stream"
                            serving[0].kill()
                            last = time.monotonic()
    except openai.APIError as e:
        error = e
        if last is not None:
            stall = max(stall, time.monotonic() - last)
    assert last is not None, "the stream ended before the kill"
    return chunks, usage, finish, stall, error


async def test_worker_sigkill_mid_stream_migrates(mockers, frontend_factory, wait_workers, fault_row):
    row = fault_row(
        "worker SIGKILL mid-stream, migration on",
        "2 agg workers; SIGKILL the one streaming after 10 chunks (--migration-limit 1)",
        MIGRATION_STALL_BOUND_S,
    )
    a, b = mockers("null", speedup=1.0), mockers("null", speedup=1.0)
    fe = await frontend_factory(migration_limit=1)
    await wait_workers(fe, 2, mockers=[a, b])
    async with client(fe) as c:
        _, usage, finish, stall, error = await stream_and_kill(c, [a, b], 120, kill_after=10)
    row.lost = int(error is not None)
    assert error is None, f"the stream broke instead of migrating: {error}"
    row.answered(stall)
    assert fe.server is not None and fe.server.dispatcher.migrations == 1
    assert metric(_frontend_metrics(fe), "dynamo_frontend_migrations_total", 'model="tiny"') == 1
    # one uninterrupted stream with correct usage: every token asked for, counted once
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == 120
    assert usage.prompt_tokens > 0 and usage.total_tokens == usage.prompt_tokens + 120
    assert row.within_bound(), f"the stream stalled {stall:.2f}s while migrating"


async def test_decode_worker_sigkill_mid_stream_migrates_to_a_new_pair(
    mockers, frontend_factory, wait_workers, wait_warm, fault_row
):
    row = fault_row(
        "decode worker SIGKILL mid-stream, migration on",
        "1 prefill + 2 decode workers; SIGKILL the decoding one after 10 chunks: new prefill+decode pair",
        MIGRATION_STALL_BOUND_S,
    )
    p = mockers("prefill", speedup=1.0)
    d1, d2 = mockers("decode", speedup=1.0), mockers("decode", speedup=1.0)
    fe = await frontend_factory(migration_limit=1)
    await wait_workers(fe, 3, mockers=[p, d1, d2])
    await wait_warm(fe, 2)  # both pairs' warm-ups: one more leg on the prefill worker each
    async with client(fe) as c:
        _, usage, finish, stall, error = await stream_and_kill(c, [d1, d2], 120, kill_after=10)
    row.lost = int(error is not None)
    assert error is None, f"the stream broke instead of migrating: {error}"
    row.answered(stall)
    assert finish == "length" and usage is not None and usage.completion_tokens == 120
    # the continuation was a whole new disaggregated request: the prefill worker served two legs (and
    # the two warm-ups)
    text = p.metrics()
    legs = sum(metric(text, "dynamo_worker_requests_total", f'outcome="{o}"') for o in ("length", "stop"))
    assert legs == 2 + 2
    assert row.within_bound(), f"the stream stalled {stall:.2f}s while migrating"


async def test_worker_sigkill_mid_stream_without_migration_errors(
    mockers, frontend_factory, wait_workers, fault_row
):
    row = fault_row(
        "worker SIGKILL mid-stream, migration off",
        "1 agg worker; SIGKILL it after 10 chunks (--migration-limit 0): error event",
        ERROR_BOUND_S,
    )
    m = mockers("null", speedup=1.0)
    fe = await frontend_factory(migration_limit=0)
    await wait_workers(fe, 1, mockers=[m])
    async with client(fe) as c:
        chunks, _, finish, after_kill, error = await stream_and_kill(c, [m], 2000, kill_after=10)
    row.lost = 1  # by design: nothing can continue it
    assert isinstance(error, openai.APIError) and "worker" in str(error.message).lower()
    assert finish is None and chunks >= 10
    row.answered(after_kill)
    assert row.within_bound(), f"the error came {after_kill:.2f}s after the kill"


async def test_dead_worker_is_quarantined(mockers, frontend_factory, wait_workers, fault_row):
    row = fault_row(
        "dead worker quarantined",
        "2 agg workers; SIGKILL one (its record stays 10s); 20 requests: none fails, none tries it twice",
        ERROR_BOUND_S,
    )
    a, b = mockers("null"), mockers("null")
    fe = await frontend_factory()
    await wait_workers(fe, 2, mockers=[a, b])
    a.kill()
    statuses = []
    async with client(fe) as c:
        for _ in range(20):
            started = time.monotonic()
            try:
                r = await c.completions.create(model=MODEL, prompt="hi", max_tokens=3)
                statuses.append(r.choices[0].finish_reason)
            except openai.APIStatusError as e:
                statuses.append(e.status_code)
            row.answered(time.monotonic() - started)
    row.lost = sum(1 for s in statuses if isinstance(s, int))
    assert row.lost == 0, statuses
    assert fe.quarantine is not None and len(fe.quarantine.ids) == 1
    assert len(fe.registry.get(MODEL).workers) == 2, "the test ran while discovery still listed it"
    assert row.within_bound()


async def test_no_live_worker_is_503_naming_the_role(mockers, frontend_factory, wait_workers, fault_row):
    row = fault_row(
        "no workers",
        "SIGKILL the only decode worker (record still listed): 503 naming the role, no 502",
        ERROR_BOUND_S,
    )
    p, d = mockers("prefill"), mockers("decode")
    fe = await frontend_factory()
    await wait_workers(fe, 2, mockers=[p, d])
    d.kill()
    async with client(fe) as c:
        for _ in range(5):
            started = time.monotonic()
            with pytest.raises(openai.APIStatusError) as e:
                await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
            row.answered(time.monotonic() - started)
            assert e.value.status_code == 503, e.value.message
            assert "decode worker" in e.value.message, e.value.message
            assert e.value.response.headers.get("retry-after") == "1"
    assert len(fe.registry.get(MODEL).workers) == 2, "the test ran while discovery still listed it"
    assert row.within_bound()


async def test_prefill_lost_mid_transfer_errors_within_first_token_bound(
    mockers, frontend_factory, wait_workers, wait_warm, fault_row
):
    row = fault_row(
        "prefill leg lost mid-transfer",
        "SIGKILL the prefill worker during a 3s prefill; decode waits up to 300s for it",
        FIRST_TOKEN_ERROR_BOUND_S,
    )
    p = mockers("prefill", "--prefill-base-ms", "3000", "--bootstrap-timeout-s", "300", speedup=1.0)
    d = mockers("decode", "--bootstrap-timeout-s", "300", speedup=1.0)
    fe = await frontend_factory(first_token_timeout_s=300.0)
    await wait_workers(fe, 2, mockers=[p, d])
    await wait_warm(fe, 1)  # the pair's warm-up is not the request below
    async with client(fe) as c:
        request = asyncio.create_task(c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8))
        await until(lambda: inflight(p) > 0 and inflight(d) > 0, "both legs to reach their workers")
        p.kill()
        killed = time.monotonic()
        with pytest.raises(openai.APIStatusError) as e:
            await request
        row.answered(time.monotonic() - killed)
    row.lost = 1
    assert e.value.status_code in (502, 503) and "prefill" in e.value.message, e.value.message
    await until(lambda: inflight(d) == 0, "the decode leg to end", within_s=FIRST_TOKEN_ERROR_BOUND_S)
    assert row.within_bound(), f"answered {row.observed_s:.2f}s after the kill"


async def test_client_disconnect_before_first_token_cancels_both_legs(
    mockers, frontend_factory, wait_workers, wait_warm, fault_row
):
    row = fault_row(
        "client disconnect before first token",
        "disaggregated; the client closes during a 3s prefill: both legs cancelled on both workers",
        CANCEL_BOUND_S,
    )
    p = mockers("prefill", "--prefill-base-ms", "3000", speedup=1.0)
    d = mockers("decode", speedup=1.0)
    fe = await frontend_factory()
    await wait_workers(fe, 2, mockers=[p, d])
    await wait_warm(fe, 1)  # the pair's warm-up is not the request below
    before = cancelled(p), cancelled(d)
    async with client(fe) as c:
        request = asyncio.create_task(
            c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=50, stream=True)
        )
        await until(lambda: inflight(p) > 0 and inflight(d) > 0, "both legs to reach their workers")
        request.cancel()  # closes the connection before any token
        gone = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await request
    await until(
        lambda: cancelled(p) > before[0] and cancelled(d) > before[1] and inflight(p) == inflight(d) == 0,
        "both workers to cancel their leg",
    )
    row.answered(time.monotonic() - gone)
    assert fe.server is not None
    await until(lambda: fe.server.inflight == 0, "the frontend to drop the request")
    assert row.within_bound(), f"legs cancelled {row.observed_s:.2f}s after the client left"


async def test_kv_transfer_that_never_completes_ends_at_the_bound(
    mockers, frontend_factory, wait_workers, fault_row, tmp_path
):
    row = fault_row(
        "KV transfer never completes",
        "1P+1D alive, the decode leg's KV transfer hangs: 504 at --kv-transfer-timeout-s 2, legs aborted",
        KV_TRANSFER_TIMEOUT_S + CANCEL_BOUND_S,
    )
    fault = tmp_path / "stuck-transfer"
    fault.touch()
    p = mockers("prefill", speedup=1.0)
    d = mockers("decode", "--kv-transfer-fault-file", str(fault), speedup=1.0)
    # no warm-up: it would meet the stuck transfer too (serving.warmup); this row is the request's bound
    fe = await frontend_factory(kv_transfer_timeout_s=KV_TRANSFER_TIMEOUT_S, pair_warmup_timeout_s=0)
    await wait_workers(fe, 2, mockers=[p, d])
    before = cancelled(d)
    async with client(fe) as c:
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as e:
            await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8)
        row.answered(time.monotonic() - started)
    row.lost = 1
    assert e.value.status_code == 504, e.value.message
    assert "kv-transfer-timeout-s" in e.value.message and d.instance_id in e.value.message, e.value.message
    await until(lambda: cancelled(d) > before and inflight(d) == 0 and inflight(p) == 0, "both legs to end")
    fault.unlink()  # the same pair serves again once the transfer works
    async with client(fe) as c:
        answer = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
    assert answer.choices[0].finish_reason == "length"
    assert row.within_bound(), f"answered {row.observed_s:.2f}s after the request"


async def test_kv_transfer_that_never_completes_is_retried_on_another_pair(
    mockers, frontend_factory, wait_workers, fault_row, tmp_path
):
    row = fault_row(
        "KV transfer never completes, second pair",
        "2P+2D, one decode's transfers hang: answered by the other pair after the 2 s bound, none lost",
        KV_TRANSFER_TIMEOUT_S + CANCEL_BOUND_S,
    )
    fault = tmp_path / "stuck-transfer"
    fault.touch()
    # connections open at once: the retry's new pair must not pay the 3 s of a first transfer (warm-ups are
    # off below), which is longer than this row's 2 s bound
    free = ("--kv-first-transfer-s", "0")
    prefills = [mockers("prefill", *free, speedup=1.0) for _ in range(2)]
    stuck = mockers("decode", "--kv-transfer-fault-file", str(fault), *free, speedup=1.0)
    healthy = mockers("decode", *free, speedup=1.0)
    # no warm-ups: with them the stuck decode worker never warms and gets no user request at all
    # (test_frontend_warm_pairs); this row is the retry of a request that met a stuck transfer
    fe = await frontend_factory(kv_transfer_timeout_s=KV_TRANSFER_TIMEOUT_S, pair_warmup_timeout_s=0)
    await wait_workers(fe, 4, mockers=[*prefills, stuck, healthy])
    async with client(fe) as c:
        for _ in range(4):  # round-robin sends some of them to the stuck decode worker first
            started = time.monotonic()
            answer = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
            row.answered(time.monotonic() - started)
            assert answer.choices[0].finish_reason == "length"
    assert metric(stuck.metrics(), "dynamo_worker_requests_total", 'outcome="cancelled"') >= 1, (
        "no request met the stuck decode worker: the test did not exercise the retry"
    )
    await until(lambda: inflight(stuck) == 0, "the stuck decode worker's legs to be cancelled")
    assert row.within_bound(), f"slowest answer {row.observed_s:.2f}s"
