"""Feed a ``Router`` from the event plane: KV cache events, snapshots and load metrics (NATS I/O).

``feed_router`` subscribes to the namespace's KV events and load metrics and, for every worker that
joins, asks it for a snapshot of the blocks it holds (``KvSnapshotSync``): a frontend started after its
workers routes on their cache as soon as the answer arrives (a round trip on NATS), and every frontend
replica ends up with the same view. While a snapshot is awaited the worker's events are buffered by the
index; a worker that does not answer within the bound is followed from its events alone, and said so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription

from dynamo_worker.protocol import InstanceRecord
from dynamo_worker.router.router import Router
from dynamo_worker.runtime.aio import cancel_and_wait
from dynamo_worker.runtime.events import request_kv_snapshot, subscribe_kv_events, subscribe_load

__all__ = ["DEFAULT_SNAPSHOT_TIMEOUT_S", "KvFeed", "feed_router"]

log = logging.getLogger(__name__)

DEFAULT_SNAPSHOT_TIMEOUT_S = 5.0


class KvFeed:
    """The subscriptions and snapshot requests of one router; ``close`` stops them all."""

    def __init__(self, nc: NATS, namespace: str, router: Router, snapshot_timeout_s: float, requester: str):
        self._nc = nc
        self._namespace = namespace
        self._router = router
        self._timeout_s = snapshot_timeout_s
        self._requester = requester
        self.subscriptions: list[Subscription] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.snapshots_loaded = 0

    def worker_added(self, record: InstanceRecord) -> None:
        self._router.index.begin_sync(record.instance_id)
        task = asyncio.create_task(self._sync(record), name=f"kv-snapshot-{record.instance_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sync(self, record: InstanceRecord) -> None:
        parts = None
        try:
            parts = await request_kv_snapshot(
                self._nc,
                self._namespace,
                record.instance_id,
                timeout_s=self._timeout_s,
                requester=self._requester,
            )
        finally:  # also when cancelled: never leave the worker's events buffered
            placed = self._router.index.end_sync(record.instance_id, parts)
        if parts is None:
            log.warning(
                "Worker sent no KV snapshot within %.0fs worker=%s component=%s: routing on its KV events "
                "from now on; blocks it cached before are unknown until stored again (is it an older "
                "version?)",
                self._timeout_s,
                record.instance_id,
                record.component,
            )
            return
        self.snapshots_loaded += 1
        log.info(
            "Loaded KV snapshot worker=%s blocks=%d next_seq=%d",
            record.instance_id,
            placed,
            parts[0].next_seq,
        )

    async def close(self) -> None:
        self._router.on_worker_added = None
        for task in list(self._tasks):
            await cancel_and_wait(task)
        for sub in self.subscriptions:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self.subscriptions.clear()


async def feed_router(
    nc: NATS,
    namespace: str,
    router: Router,
    *,
    snapshot_timeout_s: float = DEFAULT_SNAPSHOT_TIMEOUT_S,
    requester: str = "frontend",
) -> KvFeed:
    """Subscribe the router to the namespace's KV events and load metrics, and ask every worker the
    router learns of from now on for its snapshot. Subscribe *before* adding workers, so that no event
    falls between a snapshot and the subscription. ``close`` the result to stop."""
    feed = KvFeed(nc, namespace, router, snapshot_timeout_s, requester)
    feed.subscriptions = [
        await subscribe_kv_events(nc, namespace, router.on_kv_events),
        await subscribe_load(nc, namespace, router.on_load),
    ]
    router.on_worker_added = feed.worker_added
    return feed
