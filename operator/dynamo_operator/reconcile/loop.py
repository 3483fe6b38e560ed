"""The controller loop both operator controllers stand on, as controller-runtime's: keys of the objects
it owns, a work queue (:mod:`dynamo_operator.reconcile.workqueue`) and a reconcile that returns a
:class:`Result`.

- ``seen(key, resource_version)``: a watch event of an owned object; it is visited, unless the event is
  the answer to the loop's own status write (``wrote``). ``forget(key)`` when the object is gone.
- A reconcile returns :data:`DONE` or ``Result(requeue_after=s)`` (visit again after ``s`` seconds, a
  slow re-check); either resets the key's backoff. An error of ``retry_on`` (the world failed, not the
  code) is logged and retried after the key's backoff; any other is retried the same way by the queue.
- Every ``resync_interval_s`` every known key is visited again (``on_resync`` runs first).
- ``stop()`` cancels the visits in flight and every timer; it returns once the workers are gone.

Timers run on a :class:`~dynamo_operator.reconcile.workqueue.Clock`: the event loop, a fake one in tests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from dynamo_operator.reconcile.workqueue import Clock, ExponentialBackoff, Timer, WorkQueue

__all__ = ["DONE", "Key", "Loop", "Result"]

logger = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class Result:
    """What a visit asks of the loop: nothing more (``DONE``), or another visit after ``requeue_after`` s."""

    requeue_after: float | None = None


DONE = Result()


class Loop:
    """One controller's loop: ``kind`` names its objects in the log (``graph``, ``model``)."""

    def __init__(
        self,
        kind: str,
        reconcile: Callable[[Key], Awaitable[Result]],
        *,
        workers: int,
        resync_interval_s: float,
        backoff: ExponentialBackoff[Key],
        retry_on: tuple[type[BaseException], ...],
        on_resync: Callable[[], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.kind = kind
        self._reconcile = reconcile
        self._resync_interval_s = resync_interval_s
        self._retry_on = retry_on
        self._on_resync = on_resync
        self._clock = clock
        self.queue: WorkQueue[Key] = WorkQueue(self._visit, workers=workers, backoff=backoff, clock=clock)
        self._known: dict[Key, None] = {}
        self._own_writes: dict[Key, str] = {}
        self._resync_timer: Timer | None = None

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self.queue.start()
        self._schedule_resync()

    async def stop(self) -> None:
        if self._resync_timer is not None:
            self._resync_timer.cancel()
            self._resync_timer = None
        await self.queue.stop()

    def _schedule_resync(self) -> None:
        clock = self._clock or asyncio.get_running_loop()
        self._resync_timer = clock.call_at(clock.time() + self._resync_interval_s, self._resync)

    def _resync(self) -> None:
        if self._on_resync is not None:
            self._on_resync()
        for key in list(self._known):
            self.queue.add(key)
        self._schedule_resync()

    # --- keys -----------------------------------------------------------------------------------
    def seen(self, key: Key, resource_version: str | None) -> None:
        """An owned object was added or changed: visit it, unless this is our own status write."""
        self._known[key] = None
        if self._own_writes.get(key) == resource_version:
            return  # our own status write: nothing new to act on
        self.queue.add(key)

    def wrote(self, key: Key, resource_version: str) -> None:
        """The loop wrote ``key`` (its status): the watch event that answers it needs no visit."""
        self._own_writes[key] = resource_version

    def forget(self, key: Key) -> None:
        """``key`` is gone: no resync, no backoff kept."""
        self._known.pop(key, None)
        self._own_writes.pop(key, None)
        self.queue.forget(key)

    def known(self) -> Iterator[Key]:
        return iter(list(self._known))

    def add(self, key: Key) -> None:
        self.queue.add(key)

    def pending(self) -> int:
        return self.queue.pending()

    # --- the visit ------------------------------------------------------------------------------
    async def _visit(self, key: Key) -> None:
        try:
            result = await self._reconcile(key)
        except self._retry_on as exc:
            delay = self.queue.add_rate_limited(key)
            namespace, name = key
            logger.warning(
                "Could not reconcile %s=%s/%s error=%s retry_in=%.0fs", self.kind, namespace, name, exc, delay
            )
            return
        self.queue.forget(key)
        if result.requeue_after is not None:
            self.queue.add_after(key, result.requeue_after)
