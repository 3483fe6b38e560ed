"""Decoding SGLang's KV event batches into our event-plane events, in both encodings SGLang uses:
tagged arrays (0.5.17) and tagged maps with defaults omitted (0.5.23). The batches are built with
SGLang's own ``msgspec.Struct`` classes of each release (their class statements executed from the
release's ``kv_events.py`` against the real msgspec; the module's other imports need torch) and must
give the same events, dp rank and routing state, HiCache's host tier (``CPU_PINNED``) included: a
backup, a demotion (GPU removal of a backed-up block) and a loss (host removal). Also: a batch that
decodes neither way is refused with what is wrong, and the relay (over a real ZMQ socket) survives
it, says so once, and carries each batch's dp rank to the event plane."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec
import pytest
import zmq
from dynamo_worker.protocol import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    hash_token_blocks,
)
from dynamo_worker.router.index import KvIndex, TierOverlap
from dynamo_worker.sglang import uses
from dynamo_worker.sglang.kv_events import DecodedBatch, KvEventDecodeError, KvEventRelay, decode_batch
from dynamo_worker.sglang.source import SourceIndex, load_structs

from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

PAGE = 2
TOKENS = [101, 102, 103, 104, 105, 106]


def sglang_batch(src, rank: int) -> bytes:
    """A batch as SGLang's scheduler of that release encodes it: a stored chain of three blocks, a
    host-tier copy, a removal, and a clear."""
    classes, failed = load_structs(SourceIndex(src), uses.KV_EVENTS_MODULE)
    assert not failed
    stored, removed = classes["BlockStored"], classes["BlockRemoved"]
    events = [
        stored(
            block_hashes=[7001, 7002],
            parent_block_hash=None,
            token_ids=TOKENS[:4],
            block_size=PAGE,
            lora_id=None,
            medium="GPU",
        ),
        stored(
            block_hashes=[7003], parent_block_hash=7002, token_ids=TOKENS[4:], block_size=PAGE, lora_id=None
        ),
        stored(
            block_hashes=[8001],
            parent_block_hash=None,
            token_ids=TOKENS[:2],
            block_size=PAGE,
            lora_id=None,
            medium="CPU_PINNED",
        ),
        removed(block_hashes=[7003], medium="GPU"),
        removed(block_hashes=[8001], medium="CPU_PINNED"),
    ]
    return msgspec.msgpack.encode(classes["KVEventBatch"](ts=12.5, events=events, attn_dp_rank=rank))


EXPECTED = [  # the second store continues the first's chain: one event
    BlockStored(parent_hash=None, block_hashes=[7001, 7002, 7003], token_ids=TOKENS),
    BlockStored(parent_hash=None, block_hashes=[8001], token_ids=TOKENS[:2], medium="host"),
    BlockRemoved(block_hashes=[7003]),
    BlockRemoved(block_hashes=[8001], medium="host"),
]


def hicache_batch(src) -> bytes:
    """What SGLang's HiCache sends for one prompt of three pages (write_through): one GPU store per
    page, the host stores of the write-through copies, a GPU eviction of the last two pages (one
    removal per radix node), and a host eviction of the last page."""
    classes, failed = load_structs(SourceIndex(src), uses.KV_EVENTS_MODULE)
    assert not failed
    stored, removed = classes["BlockStored"], classes["BlockRemoved"]
    events = []
    for medium in ("GPU", "CPU_PINNED"):
        parent = None
        for i, h in enumerate((7001, 7002, 7003)):
            tokens = TOKENS[i * PAGE : (i + 1) * PAGE]
            events.append(
                stored(
                    block_hashes=[h],
                    parent_block_hash=parent,
                    token_ids=tokens,
                    block_size=PAGE,
                    lora_id=None,
                    medium=medium,
                )
            )
            parent = h
    events += [
        removed(block_hashes=[7002, 7003], medium="GPU"),
        removed(block_hashes=[7003], medium="CPU_PINNED"),
    ]
    return msgspec.msgpack.encode(classes["KVEventBatch"](ts=1.0, events=events, attn_dp_rank=0))


def test_both_encodings_are_what_each_release_really_sends(oldest_src, newest_src):
    old = msgspec.msgpack.decode(sglang_batch(oldest_src, 1))
    new = msgspec.msgpack.decode(sglang_batch(newest_src, 1))
    assert old[1][0][:2] == ["BlockStored", [7001, 7002]]  # a tagged array
    assert new[1][0]["type"] == "BlockStored" and new[1][0]["block_hashes"] == [7001, 7002]  # a tagged map
    assert "medium" not in new[1][1]  # omit_defaults: a field left at its default is not sent


def test_both_encodings_give_the_same_events_and_dp_rank(oldest_src, newest_src):
    for src in (oldest_src, newest_src):
        got = decode_batch(msgspec.msgpack.decode(sglang_batch(src, 3)))
        assert got == DecodedBatch(events=EXPECTED, dp_rank=3)


def test_both_encodings_give_the_same_routing_state(oldest_src, newest_src):
    index = KvIndex()
    for seq, (worker, src) in enumerate((("old", oldest_src), ("new", newest_src))):
        index.add_worker(worker, PAGE)
        decoded = decode_batch(msgspec.msgpack.decode(sglang_batch(src, 0)))
        index.apply(KvEventBatch(instance_id=worker, seq=seq, events=decoded.events, dp_rank=decoded.dp_rank))
    prompt = hash_token_blocks(TOKENS, PAGE)
    assert index.overlaps(prompt, ["old", "new"]) == {"old": 2, "new": 2}
    assert index.block_count("old") == index.block_count("new") == 2


def test_host_tier_events_demote_and_lose_blocks_alike_in_both_encodings(oldest_src, newest_src):
    index = KvIndex()
    for worker, src in (("old", oldest_src), ("new", newest_src)):
        index.add_worker(worker, PAGE)
        decoded = decode_batch(msgspec.msgpack.decode(hicache_batch(src)))
        # one chain per tier (SGLang sends a store per page), then the two removals
        assert [getattr(e, "medium", None) for e in decoded.events] == ["gpu", "host", "gpu", "host"]
        result = index.apply(KvEventBatch(instance_id=worker, seq=0, events=decoded.events))
        assert result is not None and (result.removed, result.demoted) == (3, 2)  # 2 demoted, 1 lost
    prompt = hash_token_blocks(TOKENS, PAGE)
    # page 1 on the GPU, page 2 demoted to host memory, page 3 lost from both tiers
    assert index.tier_overlaps(prompt, ["old", "new"]) == {
        "old": TierOverlap(gpu=1, host=1),
        "new": TierOverlap(gpu=1, host=1),
    }
    assert index.block_count("old") == 1 and index.block_count("old", medium="host") == 2


def per_page(hashes, tokens, parent=None, **fields):
    """SGLang's stores of one prompt: an event per page, each naming the page before it."""
    events = []
    for i, h in enumerate(hashes):
        events.append(
            {
                "type": "BlockStored",
                "block_hashes": [h],
                "parent_block_hash": parent,
                "token_ids": tokens[i * PAGE : (i + 1) * PAGE],
                **fields,
            }
        )
        parent = h
    return events


def test_a_prompts_stores_page_by_page_are_one_event_per_chain():
    """A prefill of 4 prompts brings hundreds of one-page stores at once: the relay sends a chain as one
    event, and breaks it where the parent, the tier or the adapter changes."""
    other = [201, 202, 203, 204]
    events = [
        *per_page([1, 2, 3], TOKENS),
        *per_page([11, 12], other),  # another prompt: a new chain
        *per_page([4], TOKENS[:2], parent=3, medium="CPU_PINNED"),  # another tier
        *per_page([5], TOKENS[2:4], parent=4, medium="CPU_PINNED"),
        *per_page([21], other[:2], lora_name="sql"),  # another adapter
        *per_page([22], other[2:], parent=21),  # continues 21's blocks, but of the base model
        {"type": "BlockRemoved", "block_hashes": [3]},
        *per_page([3], TOKENS[4:], parent=2),  # after a removal: not merged across it
    ]
    got = decode_batch([0.0, events, 0]).events
    assert got == [
        BlockStored(parent_hash=None, block_hashes=[1, 2, 3], token_ids=TOKENS),
        BlockStored(parent_hash=None, block_hashes=[11, 12], token_ids=other),
        BlockStored(parent_hash=3, block_hashes=[4, 5], token_ids=TOKENS[:4], medium="host"),
        BlockStored(parent_hash=None, block_hashes=[21], token_ids=other[:2], lora_name="sql"),
        BlockStored(parent_hash=21, block_hashes=[22], token_ids=other[2:]),
        BlockRemoved(block_hashes=[3]),
        BlockStored(parent_hash=2, block_hashes=[3], token_ids=TOKENS[4:]),
    ]
    # the router ends up where the page-by-page events would have put it
    merged, paged = KvIndex(), KvIndex()
    for index in (merged, paged):
        index.add_worker("w", PAGE)
    merged.apply(KvEventBatch(instance_id="w", seq=0, events=got))
    for seq, event in enumerate(events):
        paged.apply(KvEventBatch(instance_id="w", seq=seq, events=decode_batch([0.0, [event], 0]).events))
    for prompt in (hash_token_blocks(TOKENS, PAGE), hash_token_blocks(other, PAGE)):
        assert merged.tier_overlaps(prompt, ["w"]) == paged.tier_overlaps(prompt, ["w"])
    assert merged.tier_overlaps(hash_token_blocks(TOKENS, PAGE), ["w"]) == {"w": TierOverlap(gpu=3)}


def test_page_by_page_arrays_give_the_chains_maps_give():
    """SGLang 0.5.17's tagged arrays (read in place on the common path) and the tagged maps of the same
    stores give the same chains."""
    other = [201, 202, 203, 204]
    maps = [
        *per_page([1, 2, 3], TOKENS),
        *per_page([11, 12], other),
        *per_page([4, 5], TOKENS[:4], parent=3, medium="CPU_PINNED"),
        *per_page([6], TOKENS[4:], parent=5, medium="GPU"),
        {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": 6, "token_ids": [1, 2, 3]},
    ]
    arrays = [
        [
            "BlockStored",
            m["block_hashes"],
            m["parent_block_hash"],
            m["token_ids"],
            PAGE,
            None,
            m.get("medium"),
        ]
        for m in maps
    ]
    got = decode_batch([0.0, arrays, 0]).events
    assert got == decode_batch([0.0, maps, 0]).events
    assert [len(e.block_hashes) for e in got if isinstance(e, BlockStored)] == [3, 2, 2, 1, 1]


def test_an_unknown_storage_medium_is_skipped_and_named():
    event = {"type": "BlockStored", "block_hashes": [1], "token_ids": [1, 2], "medium": "NVME_OF_THE_FUTURE"}
    got = decode_batch([0.0, [event, ["AllBlocksCleared"]], None])
    assert got == DecodedBatch(events=[AllBlocksCleared()], dp_rank=0, unknown_media=("NVME_OF_THE_FUTURE",))


def test_a_map_batch_names_its_rank_as_sglang_or_vllm_do():
    event = {"type": "BlockRemoved", "block_hashes": [5]}
    for key in ("attn_dp_rank", "data_parallel_rank"):
        assert decode_batch({"ts": 1.0, "events": [event], key: 2}).dp_rank == 2
    assert decode_batch([1.0, [event]]).dp_rank == 0  # an old publisher without a rank: rank 0


def test_unknown_event_types_are_skipped_and_named():
    got = decode_batch([0.0, [["SomethingNew", 1], {"type": "AlsoNew"}, ["AllBlocksCleared"]], None])
    assert got == DecodedBatch(
        events=[AllBlocksCleared()], dp_rank=0, unknown_tags=("SomethingNew", "AlsoNew")
    )


@pytest.mark.parametrize(
    ("batch", "problem"),
    [
        ({"ts": 1.0}, "events are not a list"),
        ("garbage", r"not \[ts, events, dp_rank\] nor a map"),
        ([1.0, [42]], "neither a tagged array nor a tagged map"),
        ([1.0, [{"block_hashes": [1]}]], "without a string 'type' tag"),
        ([1.0, [{"type": "BlockStored", "block_hashes": [1]}]], "has no list 'token_ids'"),
        ([1.0, [["BlockStored", ["x"], None, [1, 2]]]], "fields of the wrong type"),
        ([1.0, [], -1], "not a non-negative integer"),
    ],
)
def test_a_batch_that_decodes_neither_way_says_what_is_wrong(batch: Any, problem: str):
    with pytest.raises(KvEventDecodeError, match=problem):
        decode_batch(batch)


class Publisher:
    """An SGLang-style ZMQ PUB socket: (topic, seq, payload) frames."""

    def __init__(self) -> None:
        self.socket = zmq.Context.instance().socket(zmq.PUB)
        self.port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.seq = 0

    def send(self, payload: bytes) -> None:
        self.socket.send_multipart([b"", self.seq.to_bytes(8, "big"), payload])
        self.seq += 1

    def close(self) -> None:
        self.socket.close(linger=0)


async def test_relay_survives_an_undecodable_batch_says_so_once_and_carries_the_dp_rank(newest_src, caplog):
    pub = Publisher()
    got: list[tuple[list, int]] = []
    arrived = asyncio.Event()

    def sink(events, rank) -> None:
        got.append((list(events), rank))
        arrived.set()

    relay = KvEventRelay([f"tcp://127.0.0.1:{pub.port}"], sink)
    relay.start()
    good = sglang_batch(newest_src, 1)
    try:
        async with asyncio.timeout(10):

            def seen() -> bool:  # a SUB socket misses what is sent before it connects: resend until seen
                if got:
                    return True
                pub.send(good)
                return False

            await wait_until_async(seen, "the relay to pass a batch on", timeout_s=10, interval_s=0.05)
            pub.send(msgspec.msgpack.encode([1.0, [42], 0]))  # decodes neither way
            pub.send(b"\xc1 not msgpack")
            arrived.clear()
            pub.send(good)
            await arrived.wait()
    finally:
        await relay.stop()
        pub.close()
    assert got[-1] == (EXPECTED, 1)
    assert relay.undecodable == 2
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "decodes as neither" in errors[0].getMessage()


async def test_relay_tracks_sequence_numbers_per_dp_rank(caplog):
    """With two dp ranks SGLang runs one publisher per rank, each numbering its batches from 0; their
    interleaving is not a loss. A real gap in one rank's numbers is."""
    pubs = [Publisher(), Publisher()]
    got: list = []
    arrived = asyncio.Event()

    def sink(events, rank) -> None:
        got.extend((rank, e) for e in events)
        arrived.set()

    relay = KvEventRelay([f"tcp://127.0.0.1:{p.port}" for p in pubs], sink)
    relay.start()

    def batch(rank: int, block: int) -> bytes:
        return msgspec.msgpack.encode([1.0, [["BlockStored", [block], None, [1, 2], 2, None, None]], rank])

    def blocks() -> set[tuple[int, int]]:
        return {(rank, e.block_hashes[0]) for rank, e in got}

    try:
        async with asyncio.timeout(10):

            def joined() -> bool:  # until both publishers are joined
                if blocks() == {(0, 100), (1, 101)}:
                    return True
                for rank, pub in enumerate(pubs):
                    pub.send(batch(rank, 100 + rank))
                return False

            await wait_until_async(joined, "both publishers to be joined", timeout_s=10, interval_s=0.05)
            for rank, pub in enumerate(pubs):
                pub.send(batch(rank, 200 + rank))
            gap = pubs[0].seq
            pubs[0].seq += 4  # rank 0 loses four batches
            pubs[0].send(batch(0, 300))
            while not {(0, 200), (1, 201), (0, 300)} <= blocks():
                arrived.clear()
                await arrived.wait()
    finally:
        await relay.stop()
        for pub in pubs:
            pub.close()
    lost = [r.getMessage() for r in caplog.records if "Lost SGLang KV events" in r.getMessage()]
    assert lost == [f"Lost SGLang KV events dp_rank=0 from seq={gap} to seq={gap + 3}"]


async def test_a_relay_that_fails_says_so(caplog):
    """A sink error is a bug of ours, not SGLang's: the relay task ends, and says so loudly."""
    pub = Publisher()

    def broken_sink(events, rank) -> None:
        raise RuntimeError("sink bug")

    relay = KvEventRelay([f"tcp://127.0.0.1:{pub.port}"], broken_sink)
    relay.start()
    payload = msgspec.msgpack.encode([1.0, [["AllBlocksCleared"]], 0])
    try:

        def stopped() -> bool:
            if not relay.running:
                return True
            pub.send(payload)
            return False

        await wait_until_async(stopped, "the relay to stop", timeout_s=10, interval_s=0.05)
        await asyncio.sleep(0)  # the done callback runs on the next loop iteration
    finally:
        await relay.stop()
        pub.close()
    assert any(
        "KV event relay stopped" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
    )
