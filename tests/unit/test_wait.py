"""tests/support/wait.py: a wait returns the predicate's first truthy value; one that times out names what
it waited for and the last value seen; the async twin awaits async predicates and cuts off one that
hangs; an error raised by a predicate ends the wait with that error."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.support.wait import wait_until, wait_until_async


def test_the_first_truthy_value_is_returned():
    values = iter([0, [], {"ready": 3}, "later"])
    assert wait_until(lambda: next(values), "a ready record", timeout_s=5, interval_s=0) == {"ready": 3}


def test_a_timeout_names_what_and_the_last_value():
    seen = itertools.count()
    with pytest.raises(AssertionError) as e:
        # no pause between polls: on a loaded host a 10 ms pause could outlast a short deadline after one poll
        wait_until(lambda: next(seen) < 0, "the pod to be Ready", timeout_s=0.5, interval_s=0)
    assert str(e.value) == "timed out after 0.5s waiting for the pod to be Ready; last value: False"
    assert next(seen) >= 2, "polled more than once before giving up"


def test_an_error_in_the_predicate_ends_the_wait():
    def broken():
        raise KeyError("pods")

    with pytest.raises(KeyError):
        wait_until(broken, "never", timeout_s=5)


async def test_the_async_twin_takes_plain_and_async_predicates():
    values = iter([None, 0, 7])
    assert await wait_until_async(lambda: next(values), "seven", timeout_s=5) == 7

    async def served() -> list[str]:
        await asyncio.sleep(0)
        return ["tiny"]

    assert await wait_until_async(served, "the model listed", timeout_s=5) == ["tiny"]


async def test_the_async_twin_names_what_and_the_last_value_on_timeout():
    with pytest.raises(AssertionError, match=r"waiting for an empty queue; last value: \[\]"):
        await wait_until_async(lambda: [], "an empty queue", timeout_s=0.05)


async def test_an_async_predicate_that_hangs_is_cut_off_at_the_deadline():
    async def hangs() -> bool:
        await asyncio.Event().wait()
        return True

    with pytest.raises(AssertionError, match="waiting for a reply; last value: None"):
        await wait_until_async(hangs, "a reply", timeout_s=0.05)


async def test_the_predicates_own_timeout_is_its_error_not_the_waits():
    async def times_out() -> bool:
        raise TimeoutError("the client gave up")

    with pytest.raises(TimeoutError, match="the client gave up"):
        await wait_until_async(times_out, "never", timeout_s=5)


def test_explain_adds_its_text_to_the_timeout():
    with pytest.raises(AssertionError, match="for a 200 from /health; last value: False\nthe log tail"):
        wait_until(lambda: 503 == 200, "a 200 from /health", timeout_s=0, explain=lambda: "the log tail")
