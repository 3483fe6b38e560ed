"""A keyed work queue with controller-runtime semantics, on asyncio; the retry policy lives here.

- ``add(key)`` marks a key dirty; many adds before it is processed collapse into one visit.
- One key is never processed by two workers at once; an add during processing runs it once more after.
- ``add_after(key, delay)`` schedules an add (a slow re-check); an earlier one already scheduled wins.
- ``add_rate_limited(key)`` schedules the retry of a failed visit after the key's backoff
  (:class:`ExponentialBackoff`: per key, doubling from ``base_s`` up to ``cap_s``); ``forget(key)`` after
  a visit that succeeded starts the next failure at ``base_s`` again. A visit that raises is retried
  the same way (logged with its traceback: the processor maps the errors it expects).
- ``workers`` keys are processed concurrently.

Delays run on a :class:`Clock`: the event loop by default, a fake one in tests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, Protocol, TypeVar

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class Timer(Protocol):
    def cancel(self) -> None: ...
    def when(self) -> float: ...


class Clock(Protocol):
    """What the queue needs of time: ``asyncio``'s event loop is one (``time``, ``call_at``)."""

    def time(self) -> float: ...
    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> Timer: ...


class ExponentialBackoff(Generic[K]):
    """Per key: the n-th failure in a row waits ``base_s * 2**(n-1)`` seconds, at most ``cap_s``. Pure."""

    def __init__(self, base_s: float = 2.0, cap_s: float = 300.0) -> None:
        if base_s <= 0 or cap_s < base_s:
            raise ValueError("backoff needs 0 < base_s <= cap_s")
        self.base_s, self.cap_s = base_s, cap_s
        self._failures: dict[K, int] = {}

    def when(self, key: K) -> float:
        """Count one more failure of ``key``; the delay before its retry."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        # min() before the power would overflow: 2**1100 is not a float.
        return min(self.cap_s, self.base_s * 2.0 ** min(failures - 1, 64))

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)


class WorkQueue(Generic[K]):
    def __init__(
        self,
        process: Callable[[K], Awaitable[None]],
        *,
        workers: int,
        backoff: ExponentialBackoff[K] | None = None,
        clock: Clock | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self._process = process
        self._workers = workers
        self._backoff: ExponentialBackoff[K] = backoff or ExponentialBackoff()
        self._clock = clock
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._timers: dict[K, Timer] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def add(self, key: K) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.put_nowait(key)

    def add_after(self, key: K, delay: float) -> None:
        """Add ``key`` after ``delay`` seconds, unless an earlier add is already scheduled or due."""
        if key in self._dirty:
            return
        clock = self._clock or asyncio.get_running_loop()
        existing = self._timers.get(key)
        due = clock.time() + delay
        if existing is not None and existing.when() <= due:
            return
        if existing is not None:
            existing.cancel()
        self._timers[key] = clock.call_at(due, self._fire, key)

    def add_rate_limited(self, key: K) -> float:
        """Retry ``key`` after its backoff (one more failure counted); returns the delay."""
        delay = self._backoff.when(key)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """``key``'s visit succeeded (or the key is gone): its next failure waits ``base_s`` again."""
        self._backoff.forget(key)

    def failures(self, key: K) -> int:
        """Failures of ``key`` in a row since it was last forgotten."""
        return self._backoff.failures(key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def pending(self) -> int:
        return len(self._dirty) + len(self._processing)

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._dirty.discard(key)
            self._processing.add(key)
            try:
                await self._process(key)
            except asyncio.CancelledError:
                raise
            except Exception:  # the processor maps its own errors; this keeps the worker alive
                delay = self.add_rate_limited(key)
                logger.exception("Reconcile crashed key=%s; retrying in %.0fs", key, delay)
            finally:
                self._processing.discard(key)
                if key in self._dirty:
                    self._queue.put_nowait(key)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._worker(), name=f"reconcile-worker-{i}") for i in range(self._workers)
        ]

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
