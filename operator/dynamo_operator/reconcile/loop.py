"""The controller loop of both operator controllers, as controller-runtime's: the keys it owns, a work
queue (:mod:`dynamo_operator.reconcile.workqueue`) and a reconcile that returns :data:`DONE` or
``Result(requeue_after=s)`` (visit again in ``s`` seconds). An error of ``retry_on`` (the world failed,
not the code) is logged and retried after the key's backoff, as the queue retries any other; a visit
that returns resets it. A watch event visits its object unless it answers the loop's own write; every
``resync_interval_s`` each known key is visited again. ``stop()`` cancels visits and timers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from dynamo_operator.reconcile.workqueue import Clock, ExponentialBackoff, Timer, WorkQueue

__all__ = ["DONE", "Key", "Loop", "Result"]

logger = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class Result:
    """What a visit asks of the loop: nothing more (``DONE``), or another visit after ``requeue_after`` s."""

    requeue_after: float | None = None


DONE = Result()


@dataclass
class Loop:
    """One controller's loop; ``kind`` names its objects in the log (``graph``, ``model``)."""

    kind: str
    reconcile: Callable[[Key], Awaitable[Result]]
    workers: int
    resync_interval_s: float
    backoff: ExponentialBackoff[Key]
    retry_on: tuple[type[BaseException], ...]
    on_resync: Callable[[], None] | None = None
    clock: Clock | None = None
    queue: WorkQueue[Key] = field(init=False)
    known: dict[Key, None] = field(default_factory=dict, init=False)
    _own_writes: dict[Key, str] = field(default_factory=dict, init=False)
    _resync_timer: Timer | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.queue = WorkQueue(self._visit, workers=self.workers, backoff=self.backoff, clock=self.clock)

    def start(self) -> None:
        self.queue.start()
        self._resync_later()

    async def stop(self) -> None:
        if self._resync_timer is not None:
            self._resync_timer.cancel()
        await self.queue.stop()

    def _resync_later(self) -> None:
        clock = self.clock or asyncio.get_running_loop()
        self._resync_timer = clock.call_at(clock.time() + self.resync_interval_s, self._resync)

    def _resync(self) -> None:
        if self.on_resync is not None:
            self.on_resync()
        for key in list(self.known):
            self.queue.add(key)
        self._resync_later()

    def seen(self, key: Key, resource_version: str | None) -> None:
        """An owned object was added or changed: visit it, unless this is our own status write."""
        self.known[key] = None
        if self._own_writes.get(key) != resource_version:
            self.queue.add(key)

    def wrote(self, key: Key, resource_version: str) -> None:
        """The loop wrote ``key`` (its status): the watch event that answers it needs no visit."""
        self._own_writes[key] = resource_version

    def forget(self, key: Key) -> None:
        """``key`` is gone: no resync, no backoff kept."""
        self.known.pop(key, None)
        self._own_writes.pop(key, None)
        self.queue.forget(key)

    async def _visit(self, key: Key) -> None:
        try:
            result = await self.reconcile(key)
        except self.retry_on as exc:
            delay = self.queue.add_rate_limited(key)
            logger.warning(
                "Could not reconcile %s=%s/%s error=%s retry_in=%.0fs", self.kind, *key, exc, delay
            )
            return
        self.queue.forget(key)
        if result.requeue_after is not None:
            self.queue.add_after(key, result.requeue_after)
