"""The event plane: KV cache events and load metrics, published on core NATS subjects.

KV events: ``KvEventBatch`` on ``dynamo.<namespace>.kv_events``. Each worker numbers its batches
``seq`` = 0, 1, 2, ... A batch larger than the NATS server takes (its ``max_payload``, 1 MiB by
default: one stored event of a ~120k-token prompt) goes as several consecutive batches, its events and
then its events' blocks split between them in order, a split stored event's second part chaining from
the first's last block. A consumer that sees a jump (``SeqTracker``) has lost events of that worker and
must resynchronise (e.g. drop what it knows about that worker). The publisher's buffer is bounded:
when it overflows, the oldest pending events are dropped *and their sequence numbers consumed*, so the
loss shows up as a gap rather than as silent divergence.

A data-parallel engine's events carry their attention dp rank; one batch holds events of one rank.

Snapshots: every publisher keeps a ``KvMirror`` of what it published and answers a
``KvSnapshotRequest`` on ``dynamo.<namespace>.kv_snapshot.<instance_id>`` (``serve_kv_snapshots``)
with ``KvSnapshotPart`` messages sent to the request's reply inbox; ``request_kv_snapshot`` asks and
collects them within a bound. The mirror and ``seq`` change together, so a snapshot holds exactly the
batches numbered below its ``next_seq``.

Load: ``LoadMetrics`` on ``dynamo.<namespace>.load``, published when it changes (at most every
``min_interval_s``, 50 ms) and every ``period_s`` (1 s) regardless, so a new subscriber learns it soon.
Why 50 ms: a router combines the last report with what it sent since (``router.router``), so the period
bounds how long another frontend's burst stays unseen; 50 ms is below one prefill of a 2k-token prompt
on an H100 (60 ms), so a report is at most about one prefill old, and costs at most 20 small messages a
second per busy worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import BaseModel, ValidationError

from dynamo_worker.protocol import (
    BlockRemoved,
    BlockStored,
    KvEvent,
    KvEventBatch,
    KvSnapshotPart,
    KvSnapshotRequest,
    LoadMetrics,
    kv_events_subject,
    kv_snapshot_subject,
    load_subject,
)
from dynamo_worker.runtime.aio import cancel_and_wait
from dynamo_worker.runtime.engine import LoadSnapshot
from dynamo_worker.runtime.kv_mirror import KvMirror

__all__ = [
    "KvEventPublisher",
    "LoadPublisher",
    "SeqTracker",
    "request_kv_snapshot",
    "serve_kv_snapshots",
    "subscribe_kv_events",
    "subscribe_load",
]

log = logging.getLogger(__name__)


class KvEventPublisher:
    """Batches KV events submitted from the engine (sync, non-blocking) and publishes them in order."""

    def __init__(
        self, nc: NATS, namespace: str, instance_id: str, *, max_pending: int = 100_000, max_batch: int = 1000
    ) -> None:
        self._nc = nc
        self.namespace = namespace
        self.subject = kv_events_subject(namespace)
        self.instance_id = instance_id
        self._pending: deque[tuple[int, KvEvent]] = deque()  # (dp_rank, event)
        self._max_pending = max_pending
        self._max_batch = max_batch
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.seq = 0  # the seq of the next batch
        self.dropped = 0
        self.mirror = KvMirror()

    def submit(self, events: Sequence[KvEvent], dp_rank: int = 0) -> None:
        """Queue events (of one dp rank) for publishing; never blocks. Overflow drops the oldest and
        skips seqs."""
        if not events:
            return
        self._pending.extend((dp_rank, e) for e in events)
        overflow = len(self._pending) - self._max_pending
        if overflow > 0:
            for _ in range(overflow):
                self._pending.popleft()
            self.dropped += overflow
            self.seq += 1  # consumers see a gap
            log.warning("Dropped KV events count=%s (event plane too slow); consumers see a gap", overflow)
        self._idle.clear()
        self._wakeup.set()

    async def publish_now(self, events: Sequence[KvEvent], dp_rank: int = 0) -> KvEventBatch:
        """Publish one batch at once (bypassing the queue); for tests and engines that batch themselves.
        Over the server's ``max_payload`` it goes as several batches (see the module doc); returns the
        last."""
        batch = KvEventBatch(instance_id=self.instance_id, seq=self.seq, events=list(events), dp_rank=dp_rank)
        data = batch.model_dump_json().encode()
        if len(data) > self._nc.max_payload and (halves := _halves(batch.events)) is not None:
            for half in halves:
                batch = await self.publish_now(half, dp_rank)
            return batch
        self.seq += 1
        self.mirror.apply(batch.events, dp_rank)  # with seq, before any await: snapshots stay exact
        await self._nc.publish(self.subject, data)
        return batch

    def snapshot(self, max_blocks: int = 1000) -> list[KvSnapshotPart]:
        """What this worker has published and not removed, as snapshot parts (see the module doc)."""
        parts: list[KvSnapshotPart] = []
        for rank in sorted(self.mirror.ranks):
            for events in self.mirror.stored_events(rank, max_blocks):
                parts.append(
                    KvSnapshotPart(
                        instance_id=self.instance_id,
                        next_seq=self.seq,
                        part=len(parts),
                        last=False,
                        dp_rank=rank,
                        events=events,
                    )
                )
        if not parts:
            parts.append(KvSnapshotPart(instance_id=self.instance_id, next_seq=self.seq, part=0, last=False))
        parts[-1] = parts[-1].model_copy(update={"last": True})
        return parts

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="kv-event-publisher")

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                dp_rank = self._pending[0][0]  # a batch holds consecutive events of one dp rank
                events: list[KvEvent] = []
                while self._pending and self._pending[0][0] == dp_rank and len(events) < self._max_batch:
                    events.append(self._pending.popleft()[1])
                n = len(events)
                try:
                    await self.publish_now(events, dp_rank)
                except (nats.errors.Error, OSError) as e:
                    log.warning("Could not publish KV events count=%s error=%r", n, e)
            self._idle.set()

    async def stop(self, flush_timeout: float = 2.0) -> None:
        """Publish what is pending (bounded), then stop."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(flush_timeout):
                await self._idle.wait()
        await cancel_and_wait(self._task)
        self._task = None


def _halves(events: list[KvEvent]) -> tuple[list[KvEvent], list[KvEvent]] | None:
    """The events in two parts that say the same in order: the list halved, or its one event's blocks
    halved; None when it is one event of one block."""
    if len(events) > 1:
        return events[: len(events) // 2], events[len(events) // 2 :]
    (event,) = events
    if not isinstance(event, BlockStored | BlockRemoved) or len(event.block_hashes) < 2:
        return None
    hashes, mid = event.block_hashes, len(event.block_hashes) // 2
    if isinstance(event, BlockRemoved):
        return [event.model_copy(update={"block_hashes": hashes[:mid]})], [
            event.model_copy(update={"block_hashes": hashes[mid:]})
        ]
    cut = mid * (len(event.token_ids) // len(hashes))  # each block's tokens: page_size of them
    first = event.model_copy(update={"block_hashes": hashes[:mid], "token_ids": event.token_ids[:cut]})
    second = event.model_copy(
        update={
            "parent_hash": hashes[mid - 1],
            "block_hashes": hashes[mid:],
            "token_ids": event.token_ids[cut:],
        }
    )
    return [first], [second]


async def serve_kv_snapshots(nc: NATS, publisher: KvEventPublisher) -> Subscription:
    """Answer ``KvSnapshotRequest`` for ``publisher``'s worker; unsubscribe the result to stop."""
    subject = kv_snapshot_subject(publisher.namespace, publisher.instance_id)

    async def on_request(msg: Msg) -> None:
        if not msg.reply:
            return
        try:
            request = KvSnapshotRequest.model_validate_json(msg.data or b"{}")
        except ValidationError as e:
            log.warning("Ignored an invalid KV snapshot request error=%s", e)
            return
        parts = publisher.snapshot()  # taken at once: consistent with publisher.seq
        try:
            for part in parts:
                await nc.publish(msg.reply, part.model_dump_json().encode())
        except (nats.errors.Error, OSError) as e:
            log.warning("Could not send a KV snapshot requester=%s error=%r", request.requester, e)
            return
        log.info(
            "Sent KV snapshot requester=%s blocks=%d parts=%d next_seq=%d",
            request.requester,
            publisher.mirror.block_count(),
            len(parts),
            parts[0].next_seq,
        )

    return await nc.subscribe(subject, cb=on_request)


async def request_kv_snapshot(
    nc: NATS, namespace: str, instance_id: str, *, timeout_s: float = 5.0, requester: str = ""
) -> list[KvSnapshotPart] | None:
    """The worker's snapshot parts, or None when it did not answer completely within ``timeout_s``
    (a worker of an older version, or one that died)."""
    inbox = nc.new_inbox()
    parts: list[KvSnapshotPart] = []
    complete = asyncio.Event()

    async def on_part(msg: Msg) -> None:
        try:
            part = KvSnapshotPart.model_validate_json(msg.data)
        except ValidationError as e:
            log.warning("Ignored an invalid KV snapshot part worker=%s error=%s", instance_id, e)
            return
        parts.append(part)
        if part.last:
            complete.set()

    sub = await nc.subscribe(inbox, cb=on_part)
    try:
        request = KvSnapshotRequest(requester=requester)
        await nc.publish(
            kv_snapshot_subject(namespace, instance_id), request.model_dump_json().encode(), reply=inbox
        )
        try:
            async with asyncio.timeout(timeout_s):
                await complete.wait()
        except TimeoutError:
            return None
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    parts.sort(key=lambda p: p.part)
    if [p.part for p in parts] != list(range(len(parts))):
        log.warning("Dropped an incomplete KV snapshot worker=%s parts=%d", instance_id, len(parts))
        return None
    return parts


class LoadPublisher:
    """Publishes the latest ``LoadSnapshot``: on change (rate-limited) and periodically."""

    def __init__(
        self,
        nc: NATS,
        namespace: str,
        instance_id: str,
        *,
        min_interval_s: float = 0.05,
        period_s: float = 1.0,
    ) -> None:
        self._nc = nc
        self.subject = load_subject(namespace)
        self.instance_id = instance_id
        self.min_interval_s = min_interval_s
        self.period_s = period_s
        self._latest: LoadSnapshot | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.published = 0

    def update(self, snapshot: LoadSnapshot) -> None:
        if snapshot != self._latest:
            self._latest = snapshot
            self._changed.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="load-publisher")

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.period_s):
                    await self._changed.wait()
            self._changed.clear()
            snap = self._latest
            if snap is not None:
                msg = LoadMetrics(instance_id=self.instance_id, **dataclasses.asdict(snap))
                try:
                    await self._nc.publish(self.subject, msg.model_dump_json().encode())
                    self.published += 1
                except (nats.errors.Error, OSError) as e:
                    log.warning("Could not publish load error=%r", e)
            await asyncio.sleep(self.min_interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None


class SeqTracker:
    """Detects lost KV event batches per worker. ``observe`` returns how many batches were missed
    before this one (0 when in order); a batch at or below the last seen seq is a duplicate (-1)."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}

    def observe(self, batch: KvEventBatch) -> int:
        prev = self.last.get(batch.instance_id)
        if prev is not None and batch.seq <= prev:
            return -1
        self.last[batch.instance_id] = batch.seq
        if prev is None:
            return 0
        return batch.seq - prev - 1

    def forget(self, instance_id: str) -> None:
        self.last.pop(instance_id, None)


M = TypeVar("M", bound=BaseModel)
Callback = Callable[[KvEventBatch], Awaitable[None] | None]
LoadCallback = Callable[[LoadMetrics], Awaitable[None] | None]


async def _subscribe(
    nc: NATS, subject: str, model: type[M], callback: Callable[[M], Awaitable[None] | None]
) -> Subscription:
    async def on_msg(msg: Msg) -> None:
        try:
            item = model.model_validate_json(msg.data)
        except ValidationError as e:
            log.warning("Ignored invalid event subject=%s error=%s", subject, e)
            return
        result = callback(item)
        if inspect.isawaitable(result):
            await result

    return await nc.subscribe(subject, cb=on_msg, pending_msgs_limit=100_000)


async def subscribe_kv_events(nc: NATS, namespace: str, callback: Callback) -> Subscription:
    """Call ``callback`` with every ``KvEventBatch`` of the namespace, in arrival order."""
    return await _subscribe(nc, kv_events_subject(namespace), KvEventBatch, callback)


async def subscribe_load(nc: NATS, namespace: str, callback: LoadCallback) -> Subscription:
    """Call ``callback`` with every ``LoadMetrics`` of the namespace."""
    return await _subscribe(nc, load_subject(namespace), LoadMetrics, callback)
