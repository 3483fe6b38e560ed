"""Flow control of the endpoint picker: while a model's workers are saturated, its requests wait in a
bounded queue, by priority (``x-gateway-inference-objective``), then arrival. Pure of I/O.

Saturation comes from what the workers report (``LoadMetrics``, every ~50 ms while it changes), which counts
every picker's requests and every frontend's, as GAIE's saturation detector does: a worker is saturated when
it has ``queue_depth`` or more requests waiting, or ``kv_usage`` or more of its KV cache in use; a model is
saturated when every worker that serves its prompts (aggregated, or prefill) is. A worker that has not
reported yet is not saturated.

``admit`` returns at once while the model is not saturated and nothing of it waits; else it waits. Each
load report admits, in order, as many waiting requests as the model's workers have room for below
``queue_depth``. A full queue is ``QueueFull`` at once, a wait past ``timeout_s`` is ``QueueTimeout``:
both become a 429 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dynamo_api.errors import DynamoError

from dynamo_worker.protocol import LoadMetrics

__all__ = ["FlowControl", "QueueFull", "QueueTimeout"]

Workers = Callable[[], Sequence[str]]  # the instance ids serving a model's prompts now


class QueueFull(DynamoError):
    """The model's queue holds ``--max-queued`` requests already (the picker answers 429)."""


class QueueTimeout(DynamoError):
    """A request waited ``--queue-timeout-s`` for a worker that is not saturated (429)."""


@dataclass(order=True)
class _Waiter:
    rank: tuple[int, int]  # (-priority, arrival): the smallest is admitted first
    future: asyncio.Future[None] = field(compare=False)


@dataclass
class _Queue:
    workers: Workers
    waiting: list[_Waiter] = field(default_factory=list)

    def live(self) -> int:
        return sum(1 for w in self.waiting if not w.future.done())


class FlowControl:
    def __init__(self, queue_depth: int, kv_usage: float, max_queued: int, timeout_s: float) -> None:
        self.queue_depth = queue_depth
        self.kv_usage = kv_usage
        self.max_queued = max_queued
        self.timeout_s = timeout_s
        self._load: dict[str, LoadMetrics] = {}
        self._queues: dict[str, _Queue] = {}
        self._arrivals = itertools.count()

    def queued(self, model: str) -> int:
        q = self._queues.get(model)
        return q.live() if q else 0

    def room(self, workers: Sequence[str]) -> int:
        """How many more requests ``workers`` take before they are all saturated (0: saturated). No
        worker at all is not saturation: the picker's answer says what is missing."""
        if not workers:
            return max(self.queue_depth, 1)
        total = 0
        for w in workers:
            m = self._load.get(w)
            if m is None:
                return max(self.queue_depth, 1)  # not reported yet: not saturated
            if m.total_blocks and m.active_blocks >= self.kv_usage * m.total_blocks:
                continue
            total += max(self.queue_depth - m.waiting, 0)
        return total

    def report(self, metrics: LoadMetrics) -> None:
        self._load[metrics.instance_id] = metrics
        for model in list(self._queues):
            self._wake(model)

    def forget(self, instance_id: str) -> None:
        self._load.pop(instance_id, None)

    async def admit(self, model: str, priority: int, workers: Workers) -> None:
        if not self.queued(model) and self.room(workers()) > 0:
            return
        if self.queued(model) >= self.max_queued:
            raise QueueFull(model)
        q = self._queues.setdefault(model, _Queue(workers))
        waiter = _Waiter((-priority, next(self._arrivals)), asyncio.get_running_loop().create_future())
        heapq.heappush(q.waiting, waiter)
        try:
            async with asyncio.timeout(self.timeout_s):
                await waiter.future
        except TimeoutError:
            if not (waiter.future.done() and not waiter.future.cancelled()):
                raise QueueTimeout(model) from None
        finally:
            self._tidy(model)

    def _wake(self, model: str) -> None:
        q = self._queues[model]
        room = self.room(q.workers())
        while room > 0 and q.waiting:
            waiter = heapq.heappop(q.waiting)
            if not waiter.future.done():  # else it timed out or was cancelled
                waiter.future.set_result(None)
                room -= 1
        self._tidy(model)

    def _tidy(self, model: str) -> None:
        q = self._queues.get(model)
        if q is not None and not q.live():
            del self._queues[model]
