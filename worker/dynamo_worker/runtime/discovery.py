"""Discovery: workers register ``InstanceRecord``s in a NATS JetStream KV bucket; watchers follow it.

Bucket ``dynamo-instances``, key ``<namespace>.<component>.<endpoint>.<instance_id>``, value the
record as JSON. Each write carries a per-message TTL (``Nats-TTL``, nats-server >= 2.11); a heartbeat
rewrites the record every TTL/3, so a live worker never expires. The bucket has subject delete markers
(``limit_marker_ttl``): when a record expires because its worker stopped heartbeating (killed, frozen,
partitioned), the server itself writes a delete marker, and every watcher sees the removal as it
happens. Graceful shutdown deletes the key first. Watchers receive a live stream of changes from the
server (an ordered consumer) — no polling loop anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

import nats.js.errors
from dynamo_api.errors import DynamoError
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue
from pydantic import ValidationError

from dynamo_worker.protocol import InstanceRecord
from dynamo_worker.runtime.aio import cancel_and_wait

__all__ = [
    "DISCOVERY_BUCKET",
    "DiscoveryError",
    "InstanceAdded",
    "InstanceEvent",
    "InstanceRemoved",
    "InstanceWatcher",
    "Registration",
    "instance_key",
    "open_instances_bucket",
    "register",
]

log = logging.getLogger(__name__)

DISCOVERY_BUCKET = "dynamo-instances"
MARKER_TTL_S = 60.0  # how long the server keeps the delete marker of an expired record
NATS_OP_TIMEOUT_S = 5.0


class DiscoveryError(DynamoError, RuntimeError):
    """Discovery cannot work with this NATS server; the message says why and what to do."""


NO_JETSTREAM = (
    "NATS answered without JetStream; start nats-server with JetStream enabled (nats-server -js), "
    "which discovery and model cards need"
)


def _js(js_or_nc: JetStreamContext | NATS) -> JetStreamContext:
    return js_or_nc.jetstream() if isinstance(js_or_nc, NATS) else js_or_nc


def instance_key(record: InstanceRecord) -> str:
    return f"{record.namespace}.{record.component}.{record.endpoint}.{record.instance_id}"


async def open_instances_bucket(js_or_nc: JetStreamContext | NATS) -> KeyValue:
    """Create the discovery bucket (idempotent), or open it when it already exists."""
    js = _js(js_or_nc)
    config = KeyValueConfig(
        bucket=DISCOVERY_BUCKET,
        description="Dynamo worker instances (per-message TTL, renewed by heartbeats)",
        history=1,
        limit_marker_ttl=MARKER_TTL_S,
    )
    try:
        return await js.create_key_value(config)
    except (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError):
        raise DiscoveryError(NO_JETSTREAM) from None
    except nats.js.errors.BadRequestError as e:
        # Exists with another configuration (another version created it): use it as it is.
        log.warning("Opened existing discovery bucket with a different configuration error=%s", e)
        return await js.key_value(DISCOVERY_BUCKET)


class Registration:
    """A live registration: a heartbeat task rewrites the record with its TTL until ``deregister``."""

    def __init__(self, kv: KeyValue, js: JetStreamContext, record: InstanceRecord, ttl: float) -> None:
        self.kv = kv
        self._js = js
        self.record = record
        self.key = instance_key(record)
        self.ttl_s = max(1, math.ceil(ttl))
        self.heartbeat_s = self.ttl_s / 3
        self._task: asyncio.Task[None] | None = None
        self.heartbeats = 0

    async def _put(self) -> None:
        payload = self.record.model_dump_json().encode()
        await self._js.publish(
            f"$KV.{DISCOVERY_BUCKET}.{self.key}", payload, msg_ttl=self.ttl_s, timeout=NATS_OP_TIMEOUT_S
        )

    async def renew(self) -> None:
        """Write the record now, re-creating the bucket when NATS lost it; errors are logged (the
        heartbeat keeps trying)."""
        try:
            async with asyncio.timeout(NATS_OP_TIMEOUT_S):
                self.kv = await open_instances_bucket(self._js)
                await self._put()
            log.info("Renewed registration after a reconnect key=%s", self.key)
        except (nats.errors.Error, DiscoveryError, TimeoutError) as e:
            log.warning("Could not renew registration key=%s error=%r", self.key, e)

    async def _heartbeat(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                if failing:  # e.g. NATS restarted without its storage: make sure the bucket exists
                    self.kv = await open_instances_bucket(self._js)
                await self._put()
                self.heartbeats += 1
                if failing:
                    log.info("Renewed registration again key=%s", self.key)
                failing = False
            except (nats.errors.Error, TimeoutError) as e:
                failing = True
                log.warning("Could not renew registration key=%s error=%r", self.key, e)

    async def start(self) -> Registration:
        await self._put()
        self._task = asyncio.create_task(self._heartbeat(), name=f"heartbeat-{self.key}")
        log.info("Registered instance key=%s address=%s ttl_s=%s", self.key, self.record.address, self.ttl_s)
        return self

    async def update(self, record: InstanceRecord) -> None:
        """Replace the registered record (same key) and write it now."""
        if instance_key(record) != self.key:
            raise ValueError("update() keeps the instance key; register a new instance instead")
        self.record = record
        await self._put()

    async def deregister(self) -> None:
        """Stop heartbeating and delete the record. Errors are logged: the TTL removes it anyway."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        try:
            async with asyncio.timeout(NATS_OP_TIMEOUT_S):
                await self.kv.delete(self.key)
            log.info("Deregistered instance key=%s", self.key)
        except (nats.errors.Error, TimeoutError) as e:
            log.warning(
                "Could not delete registration key=%s error=%r (expires in %ss)", self.key, e, self.ttl_s
            )


async def register(js_or_nc: JetStreamContext | NATS, record: InstanceRecord, ttl: float) -> Registration:
    """Write ``record`` now and keep it alive with a heartbeat every ``ttl``/3 seconds."""
    js = _js(js_or_nc)
    kv = await open_instances_bucket(js)
    return await Registration(kv, js, record, ttl).start()


@dataclass(frozen=True)
class InstanceAdded:
    """A new instance, or a changed record of a known one."""

    record: InstanceRecord


@dataclass(frozen=True)
class InstanceRemoved:
    instance_id: str
    record: InstanceRecord  # the last record seen


InstanceEvent = InstanceAdded | InstanceRemoved
_FELL_BEHIND = object()


class InstanceWatcher:
    """Follows the instances of a namespace (optionally one component / endpoint).

    ``await start()`` returns once the current instances are loaded; ``instances`` is then kept up to
    date. Each ``events()`` iterator first yields ``InstanceAdded`` for every current instance, then
    every change. A consumer that falls ``max_queued`` events behind is dropped with an error log.
    """

    def __init__(
        self,
        js_or_nc: JetStreamContext | NATS,
        namespace: str,
        *,
        component: str | None = None,
        endpoint: str | None = None,
        max_queued: int = 10_000,
    ) -> None:
        self._js = _js(js_or_nc)
        self.namespace = namespace
        self.component = component
        self.endpoint = endpoint
        self.instances: dict[str, InstanceRecord] = {}
        self._by_key: dict[str, str] = {}
        self._queues: set[asyncio.Queue[object]] = set()
        self._max_queued = max_queued
        self._watch: KeyValue.KeyWatcher | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    def _pattern(self) -> str:
        parts = [self.namespace, self.component or "*", self.endpoint or "*", "*"]
        if self.component is None and self.endpoint is None:
            return f"{self.namespace}.>"
        return ".".join(parts)

    async def start(self, load_timeout_s: float = 10.0) -> InstanceWatcher:
        kv = await open_instances_bucket(self._js)
        self._watch = await kv.watch(self._pattern())
        self._task = asyncio.create_task(self._run(), name=f"watch-{self.namespace}")
        try:
            async with asyncio.timeout(load_timeout_s):
                await self._ready.wait()
        except TimeoutError:
            await self.stop()
            raise TimeoutError(f"discovery watch not loaded within {load_timeout_s}s; is NATS up?") from None
        log.info("Watching instances namespace=%s count=%s", self.namespace, len(self.instances))
        return self

    async def _run(self) -> None:
        assert self._watch is not None
        watch = self._watch
        async for entry in watch:
            if entry is None:  # the initial state has been delivered
                self._ready.set()
                continue
            self._apply(entry)
            if entry.delta == 0:
                self._ready.set()
        if watch is self._watch:  # ended on its own, not replaced by rewatch()
            for q in list(self._queues):
                self._offer(q, None)

    async def rewatch(self, timeout_s: float = 10.0) -> None:
        """Start the watch over (after a NATS reconnect): load the current records, report the ones
        that are gone as removed and the new or changed ones as added, then follow changes. NATS'
        own ordered consumer notices a restarted server only after two missed heartbeats (10 to
        20 s); this makes it as quick as the reconnect. Errors are logged; the old watch stays."""
        try:
            async with asyncio.timeout(timeout_s):
                kv = await open_instances_bucket(self._js)
                watch = await kv.watch(self._pattern())
                current: dict[str, KeyValue.Entry] = {}
                async for entry in watch:
                    if entry is not None:
                        current[entry.key] = entry
                    if entry is None or entry.delta == 0:
                        break
        except (nats.errors.Error, DiscoveryError, TimeoutError) as e:
            log.warning("Could not watch discovery again namespace=%s error=%r", self.namespace, e)
            return
        old, old_task = self._watch, self._task
        self._watch = watch
        if old_task is not None:
            await cancel_and_wait(old_task)
        if old is not None:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                async with asyncio.timeout(NATS_OP_TIMEOUT_S):
                    await old.stop()  # type: ignore[no-untyped-call]  # nats-py: KeyWatcher.stop is unannotated
        live = {k for k, e in current.items() if e.operation not in ("DEL", "PURGE") and e.value}
        for key in [k for k in self._by_key if k not in live]:
            instance_id = self._by_key.pop(key)
            record = self.instances.pop(instance_id, None)
            if record is not None:
                log.info("Instance removed key=%s (gone after a reconnect)", key)
                self._emit(InstanceRemoved(record.instance_id, record))
        for entry in current.values():
            self._apply(entry)
        self._task = asyncio.create_task(self._run(), name=f"watch-{self.namespace}")
        log.info("Watching instances again namespace=%s count=%s", self.namespace, len(self.instances))

    def _apply(self, entry: KeyValue.Entry) -> None:
        key = entry.key
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            instance_id = self._by_key.pop(key, None)
            record = self.instances.pop(instance_id, None) if instance_id else None
            if record is not None:
                log.info("Instance removed key=%s", key)
                self._emit(InstanceRemoved(record.instance_id, record))
            return
        try:
            record = InstanceRecord.model_validate_json(entry.value)
        except ValidationError as e:
            log.warning("Ignored invalid instance record key=%s error=%s", key, e)
            return
        if self.instances.get(record.instance_id) == record:
            return  # a heartbeat
        self._by_key[key] = record.instance_id
        self.instances[record.instance_id] = record
        log.info("Instance added key=%s address=%s role=%s", key, record.address, record.role)
        self._emit(InstanceAdded(record))

    def _emit(self, event: InstanceEvent) -> None:
        for q in list(self._queues):
            self._offer(q, event)

    def _offer(self, q: asyncio.Queue[object], event: InstanceEvent | None) -> None:
        try:
            q.put_nowait(event)
        except asyncio.QueueFull:
            log.error("Dropped a discovery consumer that fell %s events behind", self._max_queued)
            self._queues.discard(q)
            while not q.empty():
                q.get_nowait()
            q.put_nowait(_FELL_BEHIND)

    async def events(self) -> AsyncIterator[InstanceEvent]:
        """Current instances as ``InstanceAdded``, then every change, until ``stop`` (the subscription
        starts at the first ``anext``, like any async generator). Raises
        ``DiscoveryError`` when this consumer fell ``max_queued`` events behind (start over)."""
        current = list(self.instances.values())
        q: asyncio.Queue[object] = asyncio.Queue(self._max_queued + len(current))
        for record in current:
            q.put_nowait(InstanceAdded(record))
        self._queues.add(q)
        try:
            while (event := await q.get()) is not None:
                if event is _FELL_BEHIND:
                    raise DiscoveryError(
                        f"discovery consumer fell {self._max_queued} events behind; read events faster"
                    )
                yield event  # type: ignore[misc]
        finally:
            self._queues.discard(q)

    async def stop(self) -> None:
        if self._watch is not None:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                async with asyncio.timeout(NATS_OP_TIMEOUT_S):
                    await self._watch.stop()  # type: ignore[no-untyped-call]  # nats-py: KeyWatcher.stop is unannotated
            self._watch = None
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        for q in list(self._queues):
            self._offer(q, None)
