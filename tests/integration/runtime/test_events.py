"""The event plane over a real nats-server: KV event batches arrive in order with consecutive seqs,
each batch holds the events of one dp rank and says which, a lost batch shows up as a gap
(SeqTracker), a publisher overflow skips seqs instead of diverging silently, and load metrics are
published on change and periodically."""

from __future__ import annotations

import asyncio
import uuid

import nats
import pytest
from dynamo_worker.mocker.kv_manager import BlockManager
from dynamo_worker.protocol import BlockRemoved, BlockStored, KvEventBatch, LoadMetrics, hash_token_blocks
from dynamo_worker.router.index import KvIndex
from dynamo_worker.runtime.engine import LoadSnapshot
from dynamo_worker.runtime.events import (
    KvEventPublisher,
    LoadPublisher,
    SeqTracker,
    subscribe_kv_events,
    subscribe_load,
)

from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration


@pytest.fixture
async def nc(nats_url):
    client = await nats.connect(nats_url)
    yield client
    await client.close()


@pytest.fixture
def namespace() -> str:
    return "ev-" + uuid.uuid4().hex[:8]


def stored(i: int) -> BlockStored:
    return BlockStored(parent_hash=None, block_hashes=[i], token_ids=[i, i])


async def test_batches_arrive_in_order_with_consecutive_seqs(nc, namespace):
    got: list[KvEventBatch] = []
    sub = await subscribe_kv_events(nc, namespace, got.append)
    publisher = KvEventPublisher(nc, namespace, "aaaaaaaaaaaaaaaa", max_batch=3)
    publisher.start()
    for i in range(20):
        publisher.submit([stored(i)])
        if i % 4 == 0:
            await asyncio.sleep(0)  # let some batches go out alone
    publisher.submit([BlockRemoved(block_hashes=[0])])
    await publisher.stop()
    await nc.flush()
    await wait_until_async(lambda: sum(len(b.events) for b in got) == 21, "all 21 events", timeout_s=5)
    assert [b.seq for b in got] == list(range(len(got)))
    events = [e for b in got for e in b.events]
    assert [e.block_hashes[0] for e in events[:20]] == list(range(20))
    assert isinstance(events[-1], BlockRemoved)
    tracker = SeqTracker()
    assert all(tracker.observe(b) == 0 for b in got)
    await sub.unsubscribe()


async def test_each_batch_holds_one_dp_ranks_events_and_names_the_rank(nc, namespace):
    got: list[KvEventBatch] = []
    sub = await subscribe_kv_events(nc, namespace, got.append)
    publisher = KvEventPublisher(nc, namespace, "dddddddddddddddd")
    publisher.start()
    publisher.submit([stored(0), stored(1)], dp_rank=0)
    publisher.submit([stored(10)], dp_rank=1)
    publisher.submit([stored(2)], dp_rank=0)
    publisher.submit([stored(3)])  # an engine without dp ranks: rank 0
    await publisher.stop()
    await nc.flush()
    await wait_until_async(lambda: sum(len(b.events) for b in got) == 5, "all 5 events", timeout_s=5)
    assert [(b.dp_rank, [e.block_hashes[0] for e in b.events]) for b in got] == [
        (0, [0, 1]),
        (1, [10]),
        (0, [2, 3]),
    ]
    assert [b.seq for b in got] == [0, 1, 2]
    await sub.unsubscribe()


async def test_a_lost_batch_is_detected_as_a_gap(nc, namespace):
    tracker = SeqTracker()
    gaps: list[int] = []
    sub = await subscribe_kv_events(nc, namespace, lambda b: gaps.append(tracker.observe(b)))
    publisher = KvEventPublisher(nc, namespace, "bbbbbbbbbbbbbbbb")
    await publisher.publish_now([stored(1)])
    publisher.seq += 2  # two batches lost on the way
    await publisher.publish_now([stored(2)])
    await nc.flush()
    await wait_until_async(lambda: len(gaps) == 2, "both batches", timeout_s=5)
    assert gaps == [0, 2]
    assert tracker.observe(KvEventBatch(instance_id="bbbbbbbbbbbbbbbb", seq=1, events=[])) == -1  # stale
    await sub.unsubscribe()


async def test_a_batch_over_the_servers_max_payload_goes_as_several_without_a_gap(nc, namespace):
    # A 128k-token prompt's blocks (page 16) and their evictions: one stored event of 8000 blocks is
    # more than the server's max_payload (1 MiB) as JSON. It arrives split, seqs consecutive, and a
    # router's index places every block of the prompt.
    tokens = [150_000 + i % 9_000 for i in range(128_000)]
    kv = BlockManager(total_blocks=8_500, page_size=16)
    old = kv.allocate("old", [7] * 16_000)
    assert old is not None
    kv.free("old")
    alloc = kv.allocate("long", tokens)
    assert alloc is not None
    removed = [e for e in alloc.events if isinstance(e, BlockRemoved)]
    assert removed and len(KvEventBatch(instance_id="x", seq=0, events=alloc.events).model_dump_json()) > (
        nc.max_payload
    )
    index = KvIndex()
    index.add_worker("eeeeeeeeeeeeeeee", page_size=16)
    got: list[KvEventBatch] = []
    sub = await subscribe_kv_events(nc, namespace, lambda b: (got.append(b), index.apply(b)))
    publisher = KvEventPublisher(nc, namespace, "eeeeeeeeeeeeeeee")
    publisher.start()
    publisher.submit(old.events)
    publisher.submit(alloc.events)
    await publisher.stop()
    await nc.flush()
    blocks = len(tokens) // 16
    await wait_until_async(
        lambda: (
            sum(len(e.block_hashes) for b in got for e in b.events if isinstance(e, BlockStored))
            == blocks + 1_000
        ),
        "every stored block",
        timeout_s=10,
    )
    assert [b.seq for b in got] == list(range(len(got))) and len(got) > 2
    prompt = hash_token_blocks(tokens, 16)
    assert index.overlaps(prompt, ["eeeeeeeeeeeeeeee"]) == {"eeeeeeeeeeeeeeee": blocks}
    assert index.block_count("eeeeeeeeeeeeeeee") == blocks + 500  # of the old 1000, 500 evicted
    await sub.unsubscribe()


async def test_publisher_overflow_drops_oldest_and_leaves_a_gap(nc, namespace):
    tracker = SeqTracker()
    gaps: list[int] = []
    got: list[KvEventBatch] = []

    def on_batch(b: KvEventBatch) -> None:
        got.append(b)
        gaps.append(tracker.observe(b))

    sub = await subscribe_kv_events(nc, namespace, on_batch)
    publisher = KvEventPublisher(nc, namespace, "cccccccccccccccc", max_pending=5)
    await publisher.publish_now([stored(0)])
    publisher.start()
    publisher.submit([stored(i) for i in range(1, 9)])  # 8 > 5 pending before the task runs
    await publisher.stop()
    await nc.flush()
    await wait_until_async(lambda: len(got) == 2, "two batches", timeout_s=5)
    assert publisher.dropped == 3
    assert gaps == [0, 1]
    assert [e.block_hashes[0] for e in got[1].events] == [4, 5, 6, 7, 8]
    await sub.unsubscribe()


async def test_load_is_published_on_change_and_periodically(nc, namespace):
    got: list[LoadMetrics] = []
    sub = await subscribe_load(nc, namespace, got.append)
    publisher = LoadPublisher(nc, namespace, "dddddddddddddddd", min_interval_s=0.01, period_s=0.2)
    publisher.start()
    publisher.update(LoadSnapshot(active_blocks=1, total_blocks=10, waiting=0, running=1))
    await wait_until_async(lambda: len(got) >= 1, "the first load report", timeout_s=5)
    assert got[0] == LoadMetrics(
        instance_id="dddddddddddddddd", active_blocks=1, total_blocks=10, waiting=0, running=1
    )
    publisher.update(LoadSnapshot(active_blocks=3, total_blocks=10, waiting=2, running=1))
    await wait_until_async(
        lambda: any(m.active_blocks == 3 for m in got), "the changed load (active_blocks=3)", timeout_s=5
    )
    count = len(got)
    await wait_until_async(
        lambda: len(got) >= count + 2, "two periodic re-sends of the unchanged load", timeout_s=5
    )  # unchanged load is re-sent every period
    assert got[-1].active_blocks == 3
    await publisher.stop()
    await sub.unsubscribe()
