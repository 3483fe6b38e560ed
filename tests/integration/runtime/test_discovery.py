"""Discovery against a real nats-server: register, heartbeat, record updates, graceful deregister,
expiry of a worker that stopped heartbeating (the server's delete marker reaches watchers; no polling),
recovery of a lost bucket, and a clear error when the server has no JetStream."""

from __future__ import annotations

import asyncio
import subprocess
import uuid

import nats
import nats.js.errors
import pytest
from dynamo_worker.protocol import InstanceRecord
from dynamo_worker.runtime.discovery import (
    DISCOVERY_BUCKET,
    DiscoveryError,
    InstanceAdded,
    InstanceRemoved,
    InstanceWatcher,
    instance_key,
    register,
)
from dynamo_worker.runtime.nats_server import bound_client_port, find_nats_server
from dynamo_worker.runtime.settings import new_instance_id

from tests.support.procs import popen
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration


def record(namespace: str, component: str = "decode", **kw) -> InstanceRecord:
    return InstanceRecord(
        instance_id=new_instance_id(),
        namespace=namespace,
        component=component,
        role="decode",
        model="m",
        address="127.0.0.1:1",
        page_size=16,
        total_kv_blocks=100,
        **kw,
    )


@pytest.fixture
async def nc(nats_url):
    client = await nats.connect(nats_url)
    yield client
    await client.close()


@pytest.fixture
def namespace() -> str:
    return "disc-" + uuid.uuid4().hex[:8]


async def next_event(events, within_s: float = 10.0):
    async with asyncio.timeout(within_s):
        return await anext(events)


async def test_register_is_seen_and_deregister_removes_it(nc, namespace):
    watcher = await InstanceWatcher(nc, namespace).start()
    events = watcher.events()
    rec = record(namespace)
    reg = await register(nc, rec, ttl=5)
    assert await next_event(events) == InstanceAdded(rec)
    assert watcher.instances == {rec.instance_id: rec}
    await reg.deregister()
    assert await next_event(events) == InstanceRemoved(rec.instance_id, rec)
    assert watcher.instances == {}
    await events.aclose()
    await watcher.stop()


async def test_a_late_watcher_loads_current_instances(nc, namespace):
    recs = [record(namespace, component=c) for c in ("prefill", "decode")]
    regs = [await register(nc, r, ttl=5) for r in recs]
    watcher = await InstanceWatcher(nc, namespace).start()
    assert set(watcher.instances) == {r.instance_id for r in recs}
    only_decode = await InstanceWatcher(nc, namespace, component="decode").start()
    assert set(only_decode.instances) == {recs[1].instance_id}
    other = await InstanceWatcher(nc, namespace + "-other").start()
    assert other.instances == {}
    for r in regs:
        await r.deregister()
    for w in (watcher, only_decode, other):
        await w.stop()


async def test_heartbeats_keep_a_live_worker_registered(nc, namespace):
    rec = record(namespace)
    reg = await register(nc, rec, ttl=1)
    watcher = await InstanceWatcher(nc, namespace).start()
    events = watcher.events()
    assert isinstance(await next_event(events), InstanceAdded)
    # two TTLs' worth of heartbeats
    await wait_until_async(lambda: reg.heartbeats >= 6, "six heartbeats", timeout_s=10, interval_s=0.05)
    assert rec.instance_id in watcher.instances
    await reg.deregister()
    assert isinstance(await next_event(events), InstanceRemoved)
    await watcher.stop()


async def test_a_worker_that_stops_heartbeating_expires_within_its_ttl(nc, namespace):
    rec = record(namespace)
    reg = await register(nc, rec, ttl=1)
    watcher = await InstanceWatcher(nc, namespace).start()
    events = watcher.events()
    assert isinstance(await next_event(events), InstanceAdded)
    assert reg._task is not None
    reg._task.cancel()  # the worker froze: no heartbeat, no delete
    removed = await next_event(events, within_s=1 + 3)
    assert removed == InstanceRemoved(rec.instance_id, rec)
    await watcher.stop()


async def test_updating_the_record_reaches_watchers(nc, namespace):
    rec = record(namespace)
    reg = await register(nc, rec, ttl=5)
    watcher = await InstanceWatcher(nc, namespace).start()
    events = watcher.events()
    assert await next_event(events) == InstanceAdded(rec)
    newer = rec.model_copy(update={"total_kv_blocks": 7})
    await reg.update(newer)
    assert await next_event(events) == InstanceAdded(newer)
    with pytest.raises(ValueError):
        await reg.update(record(namespace))
    await reg.deregister()
    await watcher.stop()


async def test_heartbeat_recreates_a_lost_bucket(nc, namespace):
    """NATS restarted without its storage: the next heartbeats bring the bucket and the record back."""
    rec = record(namespace)
    reg = await register(nc, rec, ttl=1)
    js = nc.jetstream()
    await js.delete_key_value(DISCOVERY_BUCKET)

    async def registration():
        try:
            kv = await js.key_value(DISCOVERY_BUCKET)
            return await kv.get(instance_key(rec))
        except nats.js.errors.Error:
            return None

    entry = await wait_until_async(
        registration, "the registration to come back", timeout_s=10, interval_s=0.05
    )
    assert InstanceRecord.model_validate_json(entry.value) == rec
    await reg.deregister()


@pytest.fixture
def nats_without_jetstream(tmp_path):
    log = tmp_path / "nats-server.log"
    with open(log, "wb") as out:
        proc = popen(
            [find_nats_server(), "-a", "127.0.0.1", "-p", "-1"], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        port = bound_client_port(proc, log, 20)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


async def test_a_nats_server_without_jetstream_is_a_clear_error(nats_without_jetstream):
    client = await nats.connect(nats_without_jetstream)
    with pytest.raises(DiscoveryError, match=r"nats-server -js"):
        await register(client, record("nojs"), ttl=5)
    await client.close()


async def test_a_consumer_that_falls_behind_gets_an_error_not_a_hang(nc, namespace):
    regs = [await register(nc, record(namespace, component="first"), ttl=5)]
    watcher = await InstanceWatcher(nc, namespace, max_queued=2).start()
    events = watcher.events()
    assert isinstance(await next_event(events), InstanceAdded)  # subscribed; now it stops reading
    regs += [await register(nc, record(namespace, component=f"c{i}"), ttl=5) for i in range(4)]
    await wait_until_async(
        lambda: len(watcher.instances) >= 5, "five instances in the watcher", timeout_s=10, interval_s=0.02
    )
    with pytest.raises(DiscoveryError, match="fell 2 events behind"):
        async with asyncio.timeout(5):
            async for _ in events:
                pass
    for reg in regs:
        await reg.deregister()
    await watcher.stop()


class _LaterRecord(InstanceRecord):
    """A later release's record: the same fields plus two this frontend does not know."""

    adapters_loaded: list[str] = []
    kv_tier_bytes: dict[str, int] = {}


async def test_a_frontend_reads_a_newer_workers_record(nc, namespace):
    """Rolling upgrade: a worker of a later release registers a record with fields this frontend's
    ``InstanceRecord`` does not have; the frontend still lists the worker, with every field it knows."""
    watcher = await InstanceWatcher(nc, namespace).start()
    events = watcher.events()
    known = record(namespace)
    newer = _LaterRecord(**known.model_dump(), adapters_loaded=["a"], kv_tier_bytes={"host": 1 << 30})
    reg = await register(nc, newer, ttl=5)
    kv = await nc.jetstream().key_value(DISCOVERY_BUCKET)
    stored = (await kv.get(instance_key(known))).value
    assert b'"adapters_loaded"' in stored, "the bucket holds the newer record as the worker wrote it"
    assert await next_event(events) == InstanceAdded(known)
    assert watcher.instances == {known.instance_id: known}
    await reg.deregister()
    assert await next_event(events) == InstanceRemoved(known.instance_id, known)
    await events.aclose()
    await watcher.stop()
