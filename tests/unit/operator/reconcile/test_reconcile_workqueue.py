"""The work queue: adds collapse, one key is never processed twice at once, an add during processing
runs the key once more, delayed adds fire, and a crashing visit is retried instead of killing a worker.
Retries wait the key's backoff (doubling per failure up to a cap, per key, reset by ``forget``), on the
queue's clock: a fake one here, so the delays are exact and no test waits for them."""

import asyncio

import pytest
from dynamo_operator.reconcile.workqueue import ExponentialBackoff, WorkQueue

from tests.support.clock import FakeClock
from tests.support.wait import wait_until_async


async def test_adds_collapse_and_keys_are_serialized():
    seen: list[str] = []
    running: set[str] = set()
    gate = asyncio.Event()

    async def process(key: str) -> None:
        assert key not in running, "a key was processed twice concurrently"
        running.add(key)
        seen.append(key)
        await gate.wait()
        running.discard(key)

    q: WorkQueue[str] = WorkQueue(process, workers=4)
    q.start()
    try:
        q.add("a")
        q.add("a")
        q.add("b")
        await wait_until_async(lambda: len(seen) == 2, "both keys processed", timeout_s=5.0)
        q.add("a")  # while "a" is processing: runs once more afterwards
        q.add("a")
        gate.set()
        await wait_until_async(lambda: q.pending() == 0, "an empty queue", timeout_s=5.0)
        assert sorted(seen) == ["a", "a", "b"]
    finally:
        await q.stop()


async def test_add_after_fires_and_earlier_add_wins():
    seen: list[str] = []

    async def process(key: str) -> None:
        seen.append(key)

    q: WorkQueue[str] = WorkQueue(process, workers=1)
    q.start()
    try:
        q.add_after("a", 0.05)
        q.add_after("a", 10.0)  # later than the one scheduled: ignored
        await wait_until_async(lambda: seen == ["a"], "a processed", timeout_s=5.0)
        q.add_after("b", 10.0)
        q.add("b")  # an immediate add cancels the delayed one
        await wait_until_async(lambda: seen == ["a", "b"], "a, then b processed", timeout_s=5.0)
        await asyncio.sleep(0.1)
        assert seen == ["a", "b"]
    finally:
        await q.stop()


async def test_crashing_visit_keeps_worker_alive(caplog):
    seen: list[str] = []

    async def process(key: str) -> None:
        seen.append(key)
        if key == "bad":
            raise RuntimeError("boom")

    q: WorkQueue[str] = WorkQueue(process, workers=1)
    q.start()
    try:
        q.add("bad")
        q.add("good")
        await wait_until_async(lambda: "good" in seen, "the good key processed", timeout_s=5.0)
        assert "Reconcile crashed key=bad" in caplog.text
    finally:
        await q.stop()


def test_backoff_doubles_per_failure_up_to_the_cap_per_key():
    backoff: ExponentialBackoff[str] = ExponentialBackoff(base_s=2.0, cap_s=20.0)
    assert [backoff.when("a") for _ in range(6)] == [2.0, 4.0, 8.0, 16.0, 20.0, 20.0]
    assert backoff.when("b") == 2.0, "each key has its own count"
    assert backoff.failures("a") == 6
    backoff.forget("a")
    assert backoff.failures("a") == 0 and backoff.when("a") == 2.0
    for _ in range(2000):  # a key that never recovers stays at the cap (no float overflow)
        backoff.when("b")
    assert backoff.when("b") == 20.0
    with pytest.raises(ValueError):
        ExponentialBackoff(base_s=0.0)


async def test_a_failing_key_is_retried_after_its_backoff_and_forget_resets_it():
    """The controller's pattern: a failed visit calls ``add_rate_limited``, a good one ``forget``."""
    clock = FakeClock()
    visits: list[float] = []
    outcomes = ["fail", "fail", "fail", "ok", "fail"]
    backoff: ExponentialBackoff[str] = ExponentialBackoff(base_s=2.0, cap_s=300.0)

    async def process(key: str) -> None:
        visits.append(clock.now)
        if outcomes[len(visits) - 1] == "fail":
            q.add_rate_limited(key)
        else:
            q.forget(key)

    q: WorkQueue[str] = WorkQueue(process, workers=2, backoff=backoff, clock=clock)
    q.start()
    try:

        async def visited(n: int) -> None:
            await wait_until_async(lambda: len(visits) == n and q.pending() == 0, f"visit {n}", timeout_s=5)

        q.add("g")
        await visited(1)
        assert clock.scheduled() == [102.0] and q.failures("g") == 1
        clock.advance(1.9)
        assert q.pending() == 0, "not before its backoff"
        clock.advance(0.1)
        await visited(2)
        assert clock.scheduled() == [106.0]
        clock.advance(4.0)
        await visited(3)
        assert clock.scheduled() == [114.0]
        clock.advance(8.0)
        await visited(4)  # this visit succeeded: forgotten
        assert clock.scheduled() == [] and q.failures("g") == 0
        q.add("g")
        await visited(5)
        assert clock.scheduled() == [clock.now + 2.0], "the next failure starts at the base again"
        assert visits == [100.0, 102.0, 106.0, 114.0, 114.0]
    finally:
        await q.stop()


async def test_a_crashing_visit_is_retried_after_the_keys_backoff(caplog):
    clock = FakeClock()
    visits: list[float] = []

    async def process(key: str) -> None:
        visits.append(clock.now)
        raise RuntimeError("boom")

    q: WorkQueue[str] = WorkQueue(process, workers=1, clock=clock)
    q.start()
    try:
        q.add("bad")
        await wait_until_async(lambda: clock.scheduled() == [102.0], "the first retry scheduled", timeout_s=5)
        assert "Reconcile crashed key=bad; retrying in 2s" in caplog.text
        clock.advance(2.0)
        await wait_until_async(
            lambda: clock.scheduled() == [106.0], "the second retry scheduled", timeout_s=5
        )
        assert visits == [100.0, 102.0]
    finally:
        await q.stop()
