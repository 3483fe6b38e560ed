"""The work queue: adds collapse, one key is never processed twice at once, an add during processing
runs the key once more, delayed adds fire, and a crashing visit is retried instead of killing a worker."""

import asyncio

from dynamo_operator.reconcile.workqueue import WorkQueue

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
