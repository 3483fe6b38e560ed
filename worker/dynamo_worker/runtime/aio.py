"""The event loop the processes run on: uvloop (libuv; its sockets, timers and callbacks cost less per
streamed token than the standard loop's), and the one way to stop a background task."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

__all__ = ["cancel_and_wait", "run"]

T = TypeVar("T")

log = logging.getLogger(__name__)


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a uvloop event loop."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks`` and wait until every one has ended.

    A task's own ``CancelledError`` is absorbed: it is the end we asked for. The caller's own cancellation
    is not: cancelled while waiting (or with a cancellation pending when it calls), the caller gets
    ``CancelledError`` at once, as from any await; the tasks are cancelled and end on their own. (``with
    suppress(CancelledError): await task`` cannot tell the two apart and swallows both.) The wait is
    ``asyncio.wait``, which never raises a task's outcome, so the only ``CancelledError`` it can raise
    is the caller's. A caller already unwinding a cancellation (in a ``finally``) still waits.

    A task that ended with an exception instead (it failed before the cancellation reached it, or while
    handling it) has that exception raised here, as ``await task`` would; of several, the first in
    argument order is raised and the others are logged.
    """
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)
    failures = [e for e in (t.exception() for t in tasks if not t.cancelled()) if e is not None]
    for extra in failures[1:]:
        log.error("A cancelled task had failed too error=%r", extra, exc_info=extra)
    if failures:
        raise failures[0]
