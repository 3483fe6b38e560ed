"""Relay SGLang's KV cache events (``--kv-events-config``, ZMQ publisher) onto our event plane.

SGLang's scheduler publishes each batch as three ZMQ frames ``(topic, seq as 8 bytes big-endian,
payload)``; the payload is msgpack of ``sglang.srt.disaggregation.kv_events.KVEventBatch`` encoded
"array-like": ``[ts, [event, ...], attn_dp_rank]``, each event a tagged array
``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]``,
``["BlockRemoved", block_hashes, medium]`` or ``["AllBlocksCleared"]``. ``events_from_batch`` turns a
decoded batch into our ``KvEvent`` models (pure); ``KvEventRelay`` does the ZMQ I/O. Only events of the
GPU tier are relayed (host/disk tiers do not make a prefix cheap for the router). ``pyzmq`` and
``msgspec`` come with SGLang; they are imported only when a relay starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from dynamo_worker.protocol import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

__all__ = ["KvEventRelay", "events_from_batch"]

log = logging.getLogger(__name__)

GPU_MEDIA = (None, "GPU")


def _event(raw: Sequence[Any]) -> KvEvent | None:
    tag = raw[0]
    if tag == "BlockStored":
        hashes, parent, token_ids = raw[1], raw[2], raw[3]
        medium = raw[6] if len(raw) > 6 else None
        if medium not in GPU_MEDIA:
            return None
        return BlockStored(parent_hash=parent, block_hashes=list(hashes), token_ids=list(token_ids))
    if tag == "BlockRemoved":
        medium = raw[2] if len(raw) > 2 else None
        return BlockRemoved(block_hashes=list(raw[1])) if medium in GPU_MEDIA else None
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    log.warning("Ignored an SGLang KV event of unknown type tag=%r", tag)
    return None


def events_from_batch(batch: Sequence[Any]) -> list[KvEvent]:
    """Our events from one decoded SGLang ``KVEventBatch`` (``[ts, events, attn_dp_rank]``)."""
    return [e for e in (_event(raw) for raw in batch[1]) if e is not None]


class KvEventRelay:
    """Subscribes to SGLang's publishers (one endpoint per dp rank) and hands events to ``sink``."""

    def __init__(self, endpoints: Sequence[str], sink: Callable[[Sequence[KvEvent]], None]) -> None:
        self.endpoints = list(endpoints)
        self._sink = sink
        self._task: asyncio.Task | None = None
        self._socket: Any = None
        self.relayed = 0

    def start(self) -> None:
        import zmq
        import zmq.asyncio

        self._socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        for endpoint in self.endpoints:
            self._socket.connect(endpoint)
        self._task = asyncio.create_task(self._run(), name="sglang-kv-events")
        log.info("Relaying SGLang KV events endpoints=%s", ",".join(self.endpoints))

    async def _run(self) -> None:
        import msgspec

        decoder = msgspec.msgpack.Decoder()
        # Each dp rank's publisher numbers its batches on its own; the batch names its rank.
        last_seq: dict[tuple[bytes, Any], int] = {}
        while True:
            frames = await self._socket.recv_multipart()
            if len(frames) < 3:
                log.warning("Ignored a malformed SGLang KV event message frames=%s", len(frames))
                continue
            topic, seq_bytes, payload = frames[-3:]
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            try:
                batch = decoder.decode(payload)
                events = events_from_batch(batch)
            except (msgspec.DecodeError, IndexError, TypeError, ValueError) as e:
                log.warning("Ignored an undecodable SGLang KV event batch seq=%s error=%r", seq, e)
                continue
            publisher = (topic, batch[2] if len(batch) > 2 else None)
            previous = last_seq.get(publisher)
            if previous is not None and seq != previous + 1:
                log.warning(
                    "Lost SGLang KV events dp_rank=%s from seq=%s to seq=%s",
                    publisher[1],
                    previous + 1,
                    seq - 1,
                )
            last_seq[publisher] = seq
            if events:
                self.relayed += len(events)
                self._sink(events)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
