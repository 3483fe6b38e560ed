"""One way for a test to wait for the world: poll a predicate until it holds, within a deadline.

``wait_until(predicate, what, timeout_s=...)`` calls ``predicate`` until it returns something truthy and
returns that value; past ``timeout_s`` it fails with an ``AssertionError`` naming ``what`` and the last
value seen, so a failed wait says what did not happen and how far it got; ``explain``, when given, adds
its text to that message (a process's log, say). ``wait_until_async`` is the
same inside an event loop; its predicate may be a plain function or return an awaitable. An exception
raised by the predicate ends the wait at once: a predicate that expects failures catches them itself.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _timed_out(what: str, timeout_s: float, last: Any, explain: Callable[[], str] | None) -> AssertionError:
    message = f"timed out after {timeout_s:g}s waiting for {what}; last value: {last!r}"
    return AssertionError(f"{message}\n{explain()}" if explain else message)


def wait_until(
    predicate: Callable[[], T],
    what: str,
    *,
    timeout_s: float,
    interval_s: float = 0.05,
    explain: Callable[[], str] | None = None,
) -> T:
    """``predicate()``'s first truthy value, polled every ``interval_s`` for at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout_s, last, explain)
        time.sleep(interval_s)


async def wait_until_async(
    predicate: Callable[[], T | Awaitable[T]],
    what: str,
    *,
    timeout_s: float,
    interval_s: float = 0.01,
    explain: Callable[[], str] | None = None,
) -> T:
    """``wait_until`` for a running event loop: sleeps with ``asyncio.sleep`` and awaits the predicate's
    value when it is awaitable (an ``async def`` predicate). A predicate call that hangs is cut off at the
    deadline too."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            cutoff = asyncio.timeout(max(deadline - time.monotonic(), 0.0))
            try:
                async with cutoff:
                    value = await value
            except TimeoutError:
                if not cutoff.expired():
                    raise  # the predicate's own timeout, not the wait's
                raise _timed_out(what, timeout_s, last, explain) from None
        last = value
        if last:
            return last
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout_s, last, explain)
        await asyncio.sleep(interval_s)
