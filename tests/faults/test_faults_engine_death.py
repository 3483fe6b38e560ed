"""Engine death under a live worker, end to end: real mocker worker processes whose engine's scheduler
process (the stand-in for SGLang's, ``dynamo_worker.mocker.scheduler_process``) is SIGKILLed, as an OOM
kill does to SGLang's scheduler; the real frontend; the official ``openai`` client. The worker process
lives on: it hands its streams back (``engine_died``), deregisters, and restarts its engine (or, as a
multinode leader, exits for the group restart). Each test is one row of the fault table, with requests
counted: completed (untouched), migrated (continued on another worker), lost (ended with an error;
must be 0). Every stream that completes is checked against the same request run before the fault: the
mocker's tokens depend only on the sequence before them, like a greedy model's, so a continuation
without a repeated or skipped token reproduces the reference text exactly.

Bounds (what a user is promised, generous for a loaded 2-core machine):
- ``STALL_BOUND_S`` 5 s: the longest pause a client's stream sees from the kill (noticed at once by the
  worker's pidfd watch, the stream handed back, a new connection and the prefill of prompt + streamed
  tokens on another worker), as for a SIGKILLed worker.
- ``RETRY_BOUND_S`` 5 s: a disaggregated request whose prefill engine died mid-prefill is answered by
  another prefill worker: the kill to the answer, with a 1.5 s prefill to redo; by the same one once it
  restarted its engine (plus ``RESTART_BOUND_S``) when it is the only one.
- ``RESTART_BOUND_S`` 5 s: the worker whose engine died serves again (restarted in place, registered).
- ``ONLY_WORKER_STALL_BOUND_S`` 8 s: with no other worker of the role, a stream's continuation waits for the
  restarted engine (the frontend holds it as a new request for a model with no worker): the restart
  (``RESTART_BOUND_S``) plus a stall (``STALL_BOUND_S``) at most.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from dataclasses import dataclass

import openai
import pytest

from tests.support.metrics import metric
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

MODEL = "tiny"
STALL_BOUND_S = 5.0
RETRY_BOUND_S = 5.0
RESTART_BOUND_S = 5.0
ONLY_WORKER_STALL_BOUND_S = 8.0
WAIT_S = 30.0
OSL = 120
PROMPTS = [f"Story number {i}: tell it long, with every detail you know." for i in range(6)]


def client(fe) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0, timeout=WAIT_S)


def inflight(m) -> float:
    return metric(m.metrics(), "dynamo_worker_inflight_requests")


def scheduler_pid(m) -> int:
    """The pid of the worker's engine process, as its /metrics exports it."""
    found = re.search(r'^dynamo_worker_engine_process\{[^}]*pid="(\d+)"', m.metrics(), re.M)
    assert found, "the worker exports no engine process"
    return int(found[1])


def migrations(fe) -> int:
    assert fe.server is not None
    return fe.server.dispatcher.migrations


@dataclass
class Outcome:
    text: str = ""
    tokens: int = 0
    finish: str | None = None
    error: str | None = None
    stall: float = 0.0  # the longest wait for an event after the kill


async def stream(c, prompt: str, on_content=None, killed: list[float] | None = None) -> Outcome:
    """One greedy completion stream of ``OSL`` tokens; ``on_content(n)`` after each content event."""
    out = Outcome()
    last = None
    try:
        events = await c.completions.create(
            model=MODEL, prompt=prompt, max_tokens=OSL, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        async with asyncio.timeout(WAIT_S):
            async for event in events:
                if killed:
                    now = time.monotonic()
                    out.stall = max(out.stall, now - max(killed[0], last or 0.0))
                    last = now
                if event.usage is not None:
                    out.tokens = event.usage.completion_tokens
                for choice in event.choices:
                    out.finish = choice.finish_reason or out.finish
                    if choice.text:
                        out.text += choice.text
                        if on_content is not None:
                            await on_content()
    except (openai.APIError, TimeoutError) as e:
        out.error = f"{type(e).__name__}: {e}"
        if killed:
            out.stall = max(out.stall, time.monotonic() - max(killed[0], last or 0.0))
    return out


async def references(c) -> dict[str, str]:
    """Each prompt's answer with no fault: what a continuation must reproduce."""
    outcomes = await asyncio.gather(*(stream(c, p) for p in PROMPTS))
    assert all(o.error is None and o.tokens == OSL for o in outcomes), outcomes
    return {p: o.text for p, o in zip(PROMPTS, outcomes, strict=True)}


async def streams_with_a_kill(c, serving: list, kill) -> tuple[list[Outcome], float]:
    """Every prompt streamed at once; once each has some content, ``kill(worker)`` hits one of
    ``serving`` that has requests in flight. Returns the outcomes and when the kill happened."""
    killed: list[float] = []
    started = [0]

    async def on_content() -> None:
        started[0] += 1
        if not killed and started[0] >= 3 * len(PROMPTS):
            busy = [m for m in serving if inflight(m) > 0]
            assert busy, "no worker serves the streams"
            kill(busy[0])
            killed.append(time.monotonic())

    outcomes = await asyncio.gather(*(stream(c, p, on_content, killed) for p in PROMPTS))
    assert killed, "the streams ended before the kill"
    return outcomes, killed[0]


def count(row, outcomes: list[Outcome], refs: dict[str, str], migrated: int) -> None:
    """Completed, migrated, lost; every completed stream token-exact against its reference."""
    lost = [o.error for o in outcomes if o.error is not None]
    row.lost = len(lost)
    for prompt, o in zip(PROMPTS, outcomes, strict=True):
        if o.error is None:
            assert o.finish == "length" and o.tokens == OSL, o
            assert o.text == refs[prompt], f"not token-exact:\n{o.text!r}\n{refs[prompt]!r}"
    row.done += f" -> {len(outcomes) - len(lost) - migrated} completed, {migrated} migrated, {len(lost)} lost"
    assert not lost, lost
    row.answered(max(o.stall for o in outcomes))


def kill_engine(m) -> None:
    os.kill(scheduler_pid(m), signal.SIGKILL)


def kill_rank_engine(m) -> None:
    """A non-leader rank serves no /metrics: its scheduler's pid is in its log."""
    found = re.search(r"Non-leader rank node_rank=\d+ scheduler_pid=(\d+)", m.log())
    assert found, m.log()
    os.kill(int(found[1]), signal.SIGKILL)


async def test_engine_death_in_an_aggregated_worker_is_migrated_and_the_engine_restarts(
    mockers, frontend_factory, wait_workers, fault_row
):
    row = fault_row(
        "engine death, aggregated worker",
        f"2 agg workers, {len(PROMPTS)} streams of {OSL}; SIGKILL one worker's scheduler mid-stream",
        STALL_BOUND_S,
    )
    restart = fault_row(
        "engine death: restart in place",
        "the aggregated worker whose scheduler was killed serves again (--on-engine-death restart)",
        RESTART_BOUND_S,
    )
    a, b = mockers("null", speedup=1.0), mockers("null", speedup=1.0)
    fe = await frontend_factory(migration_limit=1)
    await wait_workers(fe, 2, mockers=[a, b])
    async with client(fe) as c:
        refs = await references(c)
        victims: list = []
        outcomes, killed = await streams_with_a_kill(c, [a, b], lambda m: (victims.append(m), kill_engine(m)))
    count(row, outcomes, refs, migrations(fe))
    assert migrations(fe) >= 1
    victim = victims[0]

    def serving_again() -> bool:
        entry = fe.registry.get(MODEL)
        return (
            victim.proc.poll() is None
            and entry is not None
            and victim.instance_id in entry.workers
            and 'dynamo_worker_engine_deaths_total{action="restart"} 1.0' in victim.metrics()
        )

    await wait_until_async(serving_again, "the worker to serve again", timeout_s=WAIT_S, interval_s=0.05)
    restart.answered(time.monotonic() - killed)
    assert row.within_bound(), f"a stream stalled {row.observed_s:.2f}s"
    assert restart.within_bound(), f"served again {restart.observed_s:.2f}s after the kill"


async def test_engine_death_in_a_decode_worker_holding_transferred_kv_is_migrated(
    mockers, frontend_factory, wait_workers, fault_row
):
    row = fault_row(
        "engine death, decode worker",
        f"1 prefill + 2 decode, {len(PROMPTS)} streams; SIGKILL a decoding worker's scheduler: new pairs",
        STALL_BOUND_S,
    )
    p = mockers("prefill", speedup=1.0)
    d1, d2 = mockers("decode", speedup=1.0), mockers("decode", speedup=1.0)
    fe = await frontend_factory(migration_limit=1)
    await wait_workers(fe, 3, mockers=[p, d1, d2])
    async with client(fe) as c:
        refs = await references(c)
        outcomes, _ = await streams_with_a_kill(c, [d1, d2], kill_engine)
    count(row, outcomes, refs, migrations(fe))
    assert migrations(fe) >= 1
    assert row.within_bound(), f"a stream stalled {row.observed_s:.2f}s"


async def test_streams_of_the_only_decode_worker_wait_for_its_restarted_engine(
    mockers, frontend_factory, wait_workers, fault_row
):
    row = fault_row(
        "engine death, the only decode worker",
        f"1 prefill + 1 decode, {len(PROMPTS)} streams; SIGKILL the decode scheduler: they wait for it",
        ONLY_WORKER_STALL_BOUND_S,
    )
    p, d = mockers("prefill", speedup=1.0), mockers("decode", speedup=1.0)
    fe = await frontend_factory(migration_limit=1)
    await wait_workers(fe, 2, mockers=[p, d])
    async with client(fe) as c:
        refs = await references(c)
        outcomes, _ = await streams_with_a_kill(c, [d], kill_engine)
    count(row, outcomes, refs, migrations(fe))
    assert migrations(fe) == len(PROMPTS)  # every stream was on the dead engine, and continued
    assert row.within_bound(), f"a stream stalled {row.observed_s:.2f}s"


@pytest.mark.parametrize("prefills", [2, 1])
async def test_engine_death_in_a_prefill_worker_mid_transfer_is_retried(
    mockers, frontend_factory, wait_workers, fault_row, prefills
):
    row = fault_row(
        "engine death, prefill worker" + ("" if prefills == 2 else ", the only one"),
        f"{prefills} prefill + 1 decode; SIGKILL the prefilling worker's scheduler during a 1.5s prefill",
        RETRY_BOUND_S if prefills == 2 else RETRY_BOUND_S + RESTART_BOUND_S,
    )
    slow = ("--prefill-base-ms", "1500")
    ps = [mockers("prefill", *slow, speedup=1.0) for _ in range(prefills)]
    d = mockers("decode", speedup=1.0)
    fe = await frontend_factory(migration_limit=1)
    await wait_workers(fe, prefills + 1, mockers=[*ps, d])
    prompt = PROMPTS[0]
    async with client(fe) as c:
        reference = await c.completions.create(
            model=MODEL, prompt=prompt, max_tokens=16, temperature=0, extra_body={"ignore_eos": True}
        )
        request = asyncio.create_task(
            c.completions.create(
                model=MODEL, prompt=prompt, max_tokens=16, temperature=0, extra_body={"ignore_eos": True}
            )
        )
        busy = await wait_until_async(
            lambda: [m for m in ps if inflight(m) > 0] if inflight(d) > 0 else None,
            "both legs to reach their workers",
            timeout_s=WAIT_S,
        )
        kill_engine(busy[0])
        killed = time.monotonic()
        try:
            answer = await request
        except openai.APIError as e:
            row.lost = 1
            raise AssertionError(f"the request was lost: {e}") from None
        row.answered(time.monotonic() - killed)
    assert answer.choices[0].text == reference.choices[0].text
    assert answer.usage is not None and answer.usage.completion_tokens == 16
    row.done += " -> 1 retried on the other prefill worker" if prefills == 2 else " -> 1 waited for it"
    row.done += ", 0 lost"
    await wait_until_async(lambda: inflight(d) == 0, "the first decode leg to end", timeout_s=WAIT_S)
    assert row.within_bound(), f"answered {row.observed_s:.2f}s after the kill"


async def test_a_lost_multinode_rank_hands_back_the_groups_streams(
    mockers, frontend_factory, wait_workers, fault_row
):
    row = fault_row(
        "engine death, multinode rank",
        f"a 2-node group + 1 agg worker, {len(PROMPTS)} streams; SIGKILL rank 1's scheduler: the leader "
        "hands back its streams and exits for the group restart",
        STALL_BOUND_S,
    )
    leader = mockers("null", "--nnodes", "2", "--node-rank", "0", speedup=1.0)
    rank1 = mockers(
        "null", "--nnodes", "2", "--node-rank", "1",
        "--leader-system-addr", f"127.0.0.1:{leader.system_port}", speedup=1.0,
    )  # fmt: skip
    other = mockers("null", speedup=1.0)
    fe = await frontend_factory(migration_limit=1)
    await wait_workers(fe, 2, mockers=[leader, rank1, other])
    await wait_until_async(
        lambda: "Group rank joined the lifeline node_rank=1" in leader.log(),
        "rank 1 to join the leader's lifeline",
        timeout_s=WAIT_S,
    )
    async with client(fe) as c:
        refs = await references(c)
        outcomes, _ = await streams_with_a_kill(c, [leader], lambda _: kill_rank_engine(rank1))
    count(row, outcomes, refs, migrations(fe))
    assert migrations(fe) >= 1
    assert rank1.proc.wait(WAIT_S) == 1  # its engine is gone: the rank leaves the group
    assert leader.proc.wait(WAIT_S) == 3  # EXIT_ENGINE_DIED: the whole group restarts
    assert "rank 1 of the 2-node group is gone" in leader.log()
    assert row.within_bound(), f"a stream stalled {row.observed_s:.2f}s"
