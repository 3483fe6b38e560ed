"""Decoding SGLang's KV event batches (msgpack, array-like structs) into our event-plane events; and,
where pyzmq and msgspec are installed (they come with SGLang), the relay over a real ZMQ socket."""

from __future__ import annotations

import asyncio

import pytest
from dynamo_worker.protocol import AllBlocksCleared, BlockRemoved, BlockStored
from dynamo_worker.sglang.kv_events import KvEventRelay, events_from_batch


def test_events_from_batch_keeps_gpu_events_in_order():
    batch = [
        1700000000.0,
        [
            ["BlockStored", [11, 12], None, list(range(32)), 16, None, "GPU"],
            ["BlockStored", [13], 12, list(range(16)), 16, None],  # no medium field: GPU
            ["BlockStored", [99], None, list(range(16)), 16, None, "CPU_PINNED"],  # host tier: skipped
            ["BlockRemoved", [11], "GPU"],
            ["BlockRemoved", [99], "CPU_PINNED"],
            ["AllBlocksCleared"],
        ],
        0,
    ]
    assert events_from_batch(batch) == [
        BlockStored(parent_hash=None, block_hashes=[11, 12], token_ids=list(range(32))),
        BlockStored(parent_hash=12, block_hashes=[13], token_ids=list(range(16))),
        BlockRemoved(block_hashes=[11]),
        AllBlocksCleared(),
    ]


def test_unknown_event_types_are_skipped():
    assert events_from_batch([0.0, [["SomethingNew", 1]], None]) == []


async def test_relay_receives_what_an_sglang_style_publisher_sends():
    zmq = pytest.importorskip("zmq")
    msgspec = pytest.importorskip("msgspec")
    from dynamo_worker.runtime.nats_server import free_port

    port = free_port()
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    got: list = []
    relay = KvEventRelay([f"tcp://127.0.0.1:{port}"], got.extend)
    relay.start()
    payload = msgspec.msgpack.encode([1.0, [["BlockStored", [5], None, [1, 2], 2, None, None]], 0])
    try:
        async with asyncio.timeout(10):
            seq = 0
            while not got:  # a SUB socket misses what is sent before it connects: resend until seen
                pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
                seq += 1
                await asyncio.sleep(0.05)
    finally:
        await relay.stop()
        pub.close(linger=0)
    assert got[0] == BlockStored(parent_hash=None, block_hashes=[5], token_ids=[1, 2])


async def test_relay_tracks_sequence_numbers_per_dp_rank(caplog):
    """With --dp-size 2 SGLang runs one publisher per rank, each numbering its batches from 0; their
    interleaving is not a loss. A real gap in one rank's numbers is."""
    zmq = pytest.importorskip("zmq")
    msgspec = pytest.importorskip("msgspec")
    from dynamo_worker.runtime.nats_server import free_port

    ports = [free_port(), free_port()]
    pubs = [zmq.Context.instance().socket(zmq.PUB) for _ in ports]
    for pub, port in zip(pubs, ports, strict=True):
        pub.bind(f"tcp://127.0.0.1:{port}")
    got: list = []
    arrived = asyncio.Event()

    def sink(events) -> None:
        got.extend(events)
        arrived.set()

    relay = KvEventRelay([f"tcp://127.0.0.1:{port}" for port in ports], sink)
    relay.start()

    def batch(rank: int, block: int) -> bytes:
        return msgspec.msgpack.encode([1.0, [["BlockStored", [block], None, [1, 2], 2, None, None]], rank])

    seq = 0
    try:
        async with asyncio.timeout(10):
            while {e.block_hashes[0] for e in got} != {100, 101}:  # until both publishers are joined
                for rank, pub in enumerate(pubs):
                    pub.send_multipart([b"", seq.to_bytes(8, "big"), batch(rank, 100 + rank)])
                seq += 1
                await asyncio.sleep(0.05)
            for rank, pub in enumerate(pubs):
                pub.send_multipart([b"", seq.to_bytes(8, "big"), batch(rank, 200 + rank)])
            pubs[0].send_multipart([b"", (seq + 5).to_bytes(8, "big"), batch(0, 300)])  # rank 0 lost 4
            while not {200, 201, 300} <= {e.block_hashes[0] for e in got}:
                arrived.clear()
                await arrived.wait()
    finally:
        await relay.stop()
        for pub in pubs:
            pub.close(linger=0)
    lost = [r.getMessage() for r in caplog.records if "Lost SGLang KV events" in r.getMessage()]
    assert lost == [f"Lost SGLang KV events dp_rank=0 from seq={seq + 1} to seq={seq + 4}"]
