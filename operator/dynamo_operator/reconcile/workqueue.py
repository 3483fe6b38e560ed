"""A keyed work queue with controller-runtime semantics, on asyncio.

- ``add(key)`` marks a key dirty; many adds before it is processed collapse into one visit.
- One key is never processed by two workers at once; an add during processing runs it once more after.
- ``add_after(key, delay)`` schedules an add (requeue after an error, or a slow re-check).
- ``workers`` keys are processed concurrently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self, process: Callable[[K], Awaitable[None]], *, workers: int) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self._process = process
        self._workers = workers
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task] = []

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
        loop = asyncio.get_running_loop()
        existing = self._timers.get(key)
        due = loop.time() + delay
        if existing is not None and existing.when() <= due:
            return
        if existing is not None:
            existing.cancel()
        self._timers[key] = loop.call_at(due, self._fire, key)

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
                logger.exception("Reconcile crashed key=%s; retrying in 30s", key)
                self.add_after(key, 30.0)
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
