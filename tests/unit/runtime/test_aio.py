"""runtime.aio.cancel_and_wait: a task's own cancellation is absorbed; the caller's own cancellation
(arriving while it waits, pending when it calls, or an ``asyncio.timeout`` expiring) is raised; a caller
unwinding a cancellation in ``finally`` still waits for the task; an exception the task ended with is
raised (the first of several, the rest logged)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
from dynamo_worker.runtime.aio import cancel_and_wait


async def _forever() -> None:
    await asyncio.Event().wait()


def _slow_to_stop(release: asyncio.Event, stopped: list[str]) -> asyncio.Task[None]:
    """A task whose cleanup, once cancelled, waits for ``release``."""

    async def body() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await release.wait()
            stopped.append("cleaned up")

    return asyncio.create_task(body())


async def test_the_tasks_own_cancellation_is_absorbed():
    task = asyncio.create_task(_forever())
    await asyncio.sleep(0)
    assert await cancel_and_wait(task) is None
    assert task.cancelled()


async def test_a_task_that_already_ended_is_fine():
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    await cancel_and_wait(done)
    await cancel_and_wait()  # nothing to stop


async def test_the_callers_cancellation_while_waiting_is_raised():
    release, stopped = asyncio.Event(), []
    task = _slow_to_stop(release, stopped)
    await asyncio.sleep(0)
    after: list[str] = []

    async def caller() -> None:
        await cancel_and_wait(task)
        after.append("went on as if not cancelled")

    stopping = asyncio.create_task(caller())
    for _ in range(3):
        await asyncio.sleep(0)
    assert not stopping.done(), "the caller waits for the task's cleanup"
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert stopping.cancelled() and after == []
    release.set()
    await asyncio.wait({task})
    assert task.cancelled() and stopped == ["cleaned up"]


async def test_a_cancellation_pending_when_the_caller_calls_is_raised():
    task = asyncio.create_task(_forever())
    after: list[str] = []

    async def caller() -> None:
        current = asyncio.current_task()
        assert current is not None
        current.cancel()  # requested while running: delivered at its next await
        await cancel_and_wait(task)
        after.append("went on as if not cancelled")

    stopping = asyncio.create_task(caller())
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert after == []
    await asyncio.wait({task})
    assert task.cancelled()


async def test_a_timeout_around_it_still_fires():
    release, stopped = asyncio.Event(), []
    task = _slow_to_stop(release, stopped)
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await cancel_and_wait(task)
    release.set()
    await asyncio.wait({task})
    assert stopped == ["cleaned up"]


async def test_a_caller_unwinding_a_cancellation_still_waits_for_the_task():
    release, stopped = asyncio.Event(), []
    task = _slow_to_stop(release, stopped)
    await asyncio.sleep(0)

    async def caller() -> None:
        try:
            await asyncio.Event().wait()
        finally:  # the usual place for teardown
            await cancel_and_wait(task)
            stopped.append("caller's teardown finished")

    stopping = asyncio.create_task(caller())
    await asyncio.sleep(0)
    stopping.cancel()
    for _ in range(3):
        await asyncio.sleep(0)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await stopping  # the caller's cancellation goes on after its teardown
    assert stopped == ["cleaned up", "caller's teardown finished"]


async def test_an_exception_the_task_ended_with_is_raised():
    async def fails_on_cancel() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("could not flush") from None

    task = asyncio.create_task(fails_on_cancel())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="could not flush"):
        await cancel_and_wait(task)

    async def failed_before() -> None:
        raise KeyError("worker-1")

    crashed = asyncio.create_task(failed_before())
    await asyncio.sleep(0)
    with pytest.raises(KeyError):
        await cancel_and_wait(crashed)


async def test_several_tasks_are_all_cancelled_and_the_first_failure_raised(caplog):
    async def fail(why: str) -> None:
        raise ValueError(why)

    first, second = asyncio.create_task(fail("first")), asyncio.create_task(fail("second"))
    idle = asyncio.create_task(_forever())
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR), pytest.raises(ValueError, match="first"):
        await cancel_and_wait(idle, first, second)
    assert idle.cancelled()
    assert "second" in caplog.text


async def test_the_idiom_it_replaces_loses_the_callers_cancellation():
    """Why the helper exists: with ``suppress(CancelledError)`` the caller's own cancellation is
    swallowed and it goes on running."""
    release, stopped = asyncio.Event(), []
    task = _slow_to_stop(release, stopped)
    await asyncio.sleep(0)
    after: list[str] = []

    async def caller() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        after.append("went on as if not cancelled")

    stopping = asyncio.create_task(caller())
    await asyncio.sleep(0)
    stopping.cancel()
    release.set()
    await stopping
    assert after == ["went on as if not cancelled"]
