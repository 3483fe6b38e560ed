"""The controller loop: a reconcile's ``Result(requeue_after=s)`` visits the key again after s, ``DONE``
does not; an expected error is retried after the key's backoff and a good visit resets it; an event that
answers the loop's own write is no visit; every known key is visited each resync; ``stop()`` returns
promptly with a visit in flight and leaves no timer. On a fake clock: no test waits for a delay."""

import asyncio
from collections.abc import Awaitable, Callable

from dynamo_operator.reconcile.loop import DONE, Key, Loop, Result
from dynamo_operator.reconcile.workqueue import ExponentialBackoff

from tests.support.clock import FakeClock
from tests.support.wait import wait_until_async

A: Key = ("ns", "a")


class Flaky(Exception):
    pass


def make_loop(
    clock: FakeClock,
    reconcile: Callable[[Key], Awaitable[Result]],
    *,
    resync_interval_s: float = 300.0,
    on_resync: Callable[[], None] | None = None,
) -> Loop:
    backoff: ExponentialBackoff[Key] = ExponentialBackoff(base_s=2.0, cap_s=8.0)
    return Loop(
        "thing",
        reconcile,
        workers=2,
        resync_interval_s=resync_interval_s,
        backoff=backoff,
        retry_on=(Flaky,),
        on_resync=on_resync,
        clock=clock,
    )


async def settled(loop: Loop, visits: list[float], n: int) -> None:
    await wait_until_async(lambda: len(visits) == n and loop.queue.pending() == 0, f"visit {n}", timeout_s=5)


async def test_requeue_after_visits_again_and_done_does_not():
    clock = FakeClock()
    visits: list[float] = []
    results = [Result(requeue_after=20.0), Result(requeue_after=20.0), DONE]

    async def reconcile(key: Key) -> Result:
        visits.append(clock.now)
        return results[len(visits) - 1]

    loop = make_loop(clock, reconcile)
    loop.start()
    try:
        loop.seen(A, "1")
        await settled(loop, visits, 1)
        assert 120.0 in clock.scheduled()
        clock.advance(19.0)
        assert loop.queue.pending() == 0, "not before requeue_after"
        clock.advance(1.0)
        await settled(loop, visits, 2)
        clock.advance(20.0)
        await settled(loop, visits, 3)
        assert visits == [100.0, 120.0, 140.0]
        assert clock.scheduled() == [400.0], "DONE: only the resync is left"
    finally:
        await loop.stop()


async def test_an_expected_error_backs_off_and_a_good_visit_resets_it(caplog):
    clock = FakeClock()
    visits: list[float] = []
    outcomes = ["fail", "fail", "fail", "fail", "ok", "fail"]

    async def reconcile(key: Key) -> Result:
        visits.append(clock.now)
        if outcomes[len(visits) - 1] == "fail":
            raise Flaky("the API server is away")
        return DONE

    loop = make_loop(clock, reconcile, resync_interval_s=10_000.0)
    loop.start()
    try:
        loop.queue.add(A)
        for n, wait in enumerate([2.0, 4.0, 8.0, 8.0], start=1):  # doubling, up to the cap
            await settled(loop, visits, n)
            clock.advance(wait)
        await settled(loop, visits, 5)  # it succeeded: the backoff is forgotten
        assert loop.queue.failures(A) == 0 and clock.scheduled() == [10_100.0]
        loop.queue.add(A)
        await settled(loop, visits, 6)
        assert clock.scheduled()[0] == clock.now + 2.0, "the next failure waits the base again"
        assert visits == [100.0, 102.0, 106.0, 114.0, 122.0, 122.0]
        assert "Could not reconcile thing=ns/a error=the API server is away retry_in=2s" in caplog.text
    finally:
        await loop.stop()


async def test_an_unexpected_error_is_retried_after_the_backoff_too(caplog):
    clock = FakeClock()
    visits: list[float] = []

    async def reconcile(key: Key) -> Result:
        visits.append(clock.now)
        raise RuntimeError("a bug")

    loop = make_loop(clock, reconcile)
    loop.start()
    try:
        loop.queue.add(A)
        await wait_until_async(lambda: 102.0 in clock.scheduled(), "the retry scheduled", timeout_s=5)
        assert "Reconcile crashed" in caplog.text
    finally:
        await loop.stop()


async def test_own_writes_are_no_visit_and_resync_visits_every_known_key():
    clock = FakeClock()
    visits: list[Key] = []
    resyncs: list[float] = []

    async def reconcile(key: Key) -> Result:
        visits.append(key)
        return DONE

    loop = make_loop(clock, reconcile, on_resync=lambda: resyncs.append(clock.now))
    loop.start()
    try:
        b: Key = ("ns", "b")
        loop.seen(A, "1")
        loop.seen(b, "1")
        await wait_until_async(
            lambda: len(visits) == 2 and loop.queue.pending() == 0, "two visits", timeout_s=5
        )
        loop.wrote(A, "2")
        loop.seen(A, "2")  # the answer to our write
        assert loop.queue.pending() == 0
        loop.seen(A, "3")  # someone else's change
        await wait_until_async(lambda: len(visits) == 3 and loop.queue.pending() == 0, "a visit", timeout_s=5)
        loop.forget(b)
        clock.advance(300.0)
        await wait_until_async(
            lambda: len(visits) == 4 and loop.queue.pending() == 0, "the resync", timeout_s=5
        )
        assert visits[-1] == A and resyncs == [400.0], "a forgotten key is not resynced"
        assert clock.scheduled() == [700.0], "the next resync"
    finally:
        await loop.stop()


async def test_stop_is_bounded_with_a_visit_in_flight():
    clock = FakeClock()
    started = asyncio.Event()

    async def reconcile(key: Key) -> Result:
        started.set()
        await asyncio.Event().wait()  # a visit that never ends by itself
        return DONE

    loop = make_loop(clock, reconcile)
    loop.start()
    loop.queue.add(A)
    loop.queue.add_after(("ns", "later"), 50.0)
    await asyncio.wait_for(started.wait(), timeout=5)
    await asyncio.wait_for(loop.stop(), timeout=5)
    assert clock.scheduled() == [], "no timer left: neither the resync nor a requeue"
