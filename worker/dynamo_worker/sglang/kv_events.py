"""Relay SGLang's KV cache events (``--kv-events-config``, ZMQ publisher) onto our event plane.

SGLang's scheduler publishes each batch as three ZMQ frames ``(topic, seq as 8 bytes big-endian,
payload)``; the payload is msgpack of ``sglang.srt.disaggregation.kv_events.KVEventBatch``, an array
``[ts, [event, ...], attn_dp_rank]``. The events come in one of two encodings:

- tagged arrays (SGLang up to 0.5.19): ``["BlockStored", block_hashes, parent_block_hash, token_ids,
  block_size, lora_id, medium, ...]``, ``["BlockRemoved", block_hashes, medium]``, ``["AllBlocksCleared"]``;
- tagged maps with defaults omitted (SGLang 0.5.20+, and vLLM's encoding): ``{"type": "BlockStored",
  "block_hashes": [...], "parent_block_hash": ..., "token_ids": [...], ...}``, where a field left at its
  default (``medium: None``) is absent.

A ``BlockStored`` of an adapter's prefix cache names the adapter in ``lora_name`` (SGLang 0.5.23; a
map field), which our event carries on: the router keys the blocks on it. SGLang 0.5.17's events
carry no adapter (``lora_id`` is always None there).

``decode_batch`` turns one decoded batch into our ``KvEvent`` models and its attention-dp rank (pure),
a chain of stores that continue one another (SGLang stores a page per event) as one event;
``KvEventRelay`` does the ZMQ I/O. Every tier is relayed, its ``medium`` mapped onto ours (``MEDIA``):
SGLang's ``GPU`` (or none) is ``gpu``; ``CPU_PINNED`` is ``host`` (HiCache's host memory, L2); ``DISK``
and ``EXTERNAL`` are ``disk`` (HiCache's storage tier, L3; neither 0.5.17 nor 0.5.23 publishes them yet).
The router indexes each tier and scores a hit by what it saves (``router.index``, ``router.policy``). An
event of a medium we do not know is skipped and named once. A batch that decodes neither way is dropped
and logged (loudly the first time), and the relay goes on with the next one. ``pyzmq`` and ``msgspec``
come with SGLang; they are imported only when a relay starts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynamo_api.errors import DynamoError
from pydantic import ValidationError

from dynamo_worker.protocol import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, Medium
from dynamo_worker.runtime.aio import cancel_and_wait

__all__ = ["DecodedBatch", "KvEventDecodeError", "KvEventRelay", "decode_batch"]

log = logging.getLogger(__name__)

# SGLang's StorageMedium values (sglang.srt.disaggregation.kv_events) -> our tiers.
MEDIA: dict[str | None, Medium] = {
    None: "gpu",
    "GPU": "gpu",
    "CPU_PINNED": "host",
    "CPU": "host",  # vLLM's name for its CPU offload tier
    "DISK": "disk",
    "EXTERNAL": "disk",
}
# Array positions (after the tag) of the fields we read; the order of SGLang's struct fields.
_ARRAY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}
_REQUIRED = {"BlockStored": ("block_hashes", "token_ids"), "BlockRemoved": ("block_hashes",)}
_RANK_KEYS = ("attn_dp_rank", "data_parallel_rank")  # SGLang's name, vLLM's name


class KvEventDecodeError(DynamoError, ValueError):
    """A KV event batch that is neither of the encodings SGLang uses; the message says what is wrong."""


@dataclass(frozen=True)
class DecodedBatch:
    events: list[KvEvent]
    dp_rank: int  # the attention-dp rank whose KV cache the events describe
    unknown_tags: tuple[str, ...] = ()  # event types we do not know (skipped)
    unknown_media: tuple[str, ...] = ()  # storage media we do not know (their events skipped)


def _fields(raw: Any, index: int) -> tuple[str, dict[str, Any]]:
    """The tag and the named fields of one event, in either encoding. msgspec decodes arrays to lists:
    that case is tested first, as the ABC checks below cost a Python call per event (a prefill of 8192
    tokens brings 512 events at once)."""
    if type(raw) is list and raw and type(raw[0]) is str:
        return raw[0], dict(zip(_ARRAY_FIELDS.get(raw[0], ()), raw[1:], strict=False))
    if isinstance(raw, Mapping):
        tag = raw.get("type")
        if not isinstance(tag, str):
            raise KvEventDecodeError(f"event {index} is a map without a string 'type' tag: {_short(raw)}")
        return tag, {k: v for k, v in raw.items() if k != "type"}
    if isinstance(raw, Sequence) and not isinstance(raw, (str, bytes)) and raw and isinstance(raw[0], str):
        tag = raw[0]
        names = _ARRAY_FIELDS.get(tag, ())
        return tag, dict(zip(names, raw[1:], strict=False))
    raise KvEventDecodeError(f"event {index} is neither a tagged array nor a tagged map: {_short(raw)}")


def _medium(f: dict[str, Any]) -> Medium | None:
    raw = f.get("medium")
    return MEDIA.get(raw) if raw is None or isinstance(raw, str) else None  # None: a tier we do not know


def _lora(f: dict[str, Any]) -> str | None:
    lora = f.get("lora_name")
    return lora if isinstance(lora, str) and lora else None


@dataclass
class _Chain:
    """Consecutive ``BlockStored`` events that continue one another (each one's parent is the last
    block before it, same tier, adapter and page size): sent on as one event. SGLang stores a page per
    event, so a prefill of 4 x 2048 tokens brings 512 of them; as chains they are 4 events to build,
    mirror, encode and index."""

    first: int  # the index of its first event, for error messages
    f: dict[str, Any]  # the first event's fields; its lists grow with the events that continue it
    medium: Medium
    page: int

    def continues(self, f: dict[str, Any], medium: Medium) -> bool:
        hashes, tokens = f["block_hashes"], f["token_ids"]
        return (
            medium == self.medium
            and _lora(f) == _lora(self.f)
            and f.get("parent_block_hash") == self.f["block_hashes"][-1]
            and len(tokens) == self.page * len(hashes) > 0
        )

    def continues_array(self, raw: list[Any]) -> bool:
        """``continues`` for one event of SGLang's tagged-array encoding, read in place: the common case
        (a store per page) costs no dict of fields. The array form names no adapter."""
        if len(raw) < 4 or raw[0] != "BlockStored" or _lora(self.f) is not None:
            return False
        hashes, tokens = raw[1], raw[3]
        return (
            type(hashes) is list
            and type(tokens) is list
            and raw[2] == self.f["block_hashes"][-1]
            and MEDIA.get(raw[6] if len(raw) > 6 else None) == self.medium
            and len(tokens) == self.page * len(hashes) > 0
        )

    def extend(self, f: dict[str, Any]) -> None:
        self.f["block_hashes"].extend(f["block_hashes"])
        self.f["token_ids"].extend(f["token_ids"])

    def event(self) -> BlockStored:
        try:
            return BlockStored(
                parent_hash=self.f.get("parent_block_hash"),
                block_hashes=self.f["block_hashes"],
                token_ids=self.f["token_ids"],
                medium=self.medium,
                lora_name=_lora(self.f),
            )
        except ValidationError as e:
            problem = f"event {self.first} (BlockStored) has fields of the wrong type: {_short(self.f)} ({e})"
            raise KvEventDecodeError(problem) from None


def _chain(f: dict[str, Any], index: int, medium: Medium) -> _Chain:
    hashes, tokens = f["block_hashes"], f["token_ids"]
    page = len(tokens) // len(hashes) if hashes and len(tokens) % len(hashes) == 0 else 0
    own = dict(f, block_hashes=list(hashes), token_ids=list(tokens))  # grown in place, not the batch's
    return _Chain(index, own, medium, page)


def _event(tag: str, f: dict[str, Any], index: int, medium: Medium) -> KvEvent:
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    try:
        return BlockRemoved(block_hashes=f["block_hashes"], medium=medium)
    except ValidationError as e:
        problem = f"event {index} ({tag}) has fields of the wrong type: {_short(f)} ({e})"
        raise KvEventDecodeError(problem) from None


def decode_batch(batch: Any) -> DecodedBatch:
    """Our events and the dp rank of one msgpack-decoded SGLang (or vLLM) KV event batch: an array
    ``[ts, events, rank]`` or a map with ``events`` and ``attn_dp_rank``/``data_parallel_rank``.
    Raises ``KvEventDecodeError`` for anything else."""
    raw_events, rank = _batch_parts(batch)
    events: list[KvEvent] = []
    unknown: list[str] = []
    unknown_media: list[str] = []
    chain: _Chain | None = None
    for i, raw in enumerate(raw_events):
        if chain is not None and type(raw) is list and chain.continues_array(raw):
            chain.f["block_hashes"].extend(raw[1])
            chain.f["token_ids"].extend(raw[3])
            continue
        tag, f = _fields(raw, i)
        if tag not in _ARRAY_FIELDS:
            unknown.append(tag)
            continue
        _check_required(tag, f, i)
        medium = _medium(f)
        if medium is None and tag != "AllBlocksCleared":
            unknown_media.append(str(f.get("medium")))
            continue
        if tag == "BlockStored" and medium is not None and chain is not None and chain.continues(f, medium):
            chain.extend(f)
            continue
        if chain is not None:
            events.append(chain.event())
            chain = None
        if tag == "BlockStored" and medium is not None:
            chain = _chain(f, i, medium)
        else:
            events.append(_event(tag, f, i, medium or "gpu"))
    if chain is not None:
        events.append(chain.event())
    return DecodedBatch(
        events=events, dp_rank=rank or 0, unknown_tags=tuple(unknown), unknown_media=tuple(unknown_media)
    )


def _batch_parts(batch: Any) -> tuple[list[Any], int | None]:
    """The events and the dp rank (None: not given) of a batch, in either encoding."""
    if isinstance(batch, Mapping):
        raw_events = batch.get("events")
        rank = next((batch[k] for k in _RANK_KEYS if batch.get(k) is not None), None)
    elif isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)) and len(batch) >= 2:
        raw_events = batch[1]
        rank = batch[2] if len(batch) > 2 else None
    else:
        raise KvEventDecodeError(f"the batch is not [ts, events, dp_rank] nor a map: {_short(batch)}")
    if not isinstance(raw_events, list):
        raise KvEventDecodeError(f"the batch's events are not a list: {_short(raw_events)}")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
        raise KvEventDecodeError(f"the batch's dp rank is not a non-negative integer: {rank!r}")
    return raw_events, rank


def _check_required(tag: str, f: dict[str, Any], index: int) -> None:
    for name in _REQUIRED.get(tag, ()):
        if not isinstance(f.get(name), list):
            raise KvEventDecodeError(f"event {index} ({tag}) has no list {name!r}: {_short(f)}")


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class KvEventRelay:
    """Subscribes to SGLang's publishers (one endpoint per dp rank) and hands events to ``sink`` with
    the dp rank of their batch."""

    def __init__(self, endpoints: Sequence[str], sink: Callable[[Sequence[KvEvent], int], None]) -> None:
        self.endpoints = list(endpoints)
        self._sink = sink
        self._task: asyncio.Task[None] | None = None
        self._socket: Any = None
        self.relayed = 0
        self.undecodable = 0  # batches dropped because they decode neither way
        self._unknown_tags: set[str] = set()
        self._unknown_media: set[str] = set()

    def start(self) -> None:
        import zmq
        import zmq.asyncio

        self._socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        for endpoint in self.endpoints:
            self._socket.connect(endpoint)
        self._task = asyncio.create_task(self._run(), name="sglang-kv-events")
        self._task.add_done_callback(_report_end)
        log.info("Relaying SGLang KV events endpoints=%s", ",".join(self.endpoints))

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self) -> None:
        import msgspec

        decoder = msgspec.msgpack.Decoder()
        # Each dp rank's publisher numbers its batches on its own; the batch names its rank.
        last_seq: dict[tuple[bytes, int], int] = {}
        while True:
            frames = await self._socket.recv_multipart()
            if len(frames) < 3:
                self._undecodable(None, f"a message of {len(frames)} frames, not (topic, seq, payload)")
                continue
            topic, seq_bytes, payload = frames[-3:]
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            try:
                batch = decode_batch(decoder.decode(payload))
            except (msgspec.DecodeError, KvEventDecodeError) as e:
                self._undecodable(seq, str(e))
                continue
            for tag in set(batch.unknown_tags) - self._unknown_tags:
                self._unknown_tags.add(tag)
                log.warning("Ignoring SGLang KV events of unknown type tag=%r (logged once per type)", tag)
            for medium in set(batch.unknown_media) - self._unknown_media:
                self._unknown_media.add(medium)
                log.warning(
                    "Ignoring SGLang KV events of an unknown storage medium medium=%r (known: %s); the "
                    "router does not see that tier (logged once per medium)",
                    medium,
                    ", ".join(str(m) for m in MEDIA if m),
                )
            publisher = (topic, batch.dp_rank)
            previous = last_seq.get(publisher)
            if previous is not None and seq != previous + 1:
                log.warning(
                    "Lost SGLang KV events dp_rank=%s from seq=%s to seq=%s",
                    batch.dp_rank,
                    previous + 1,
                    seq - 1,
                )
            last_seq[publisher] = seq
            if batch.events:
                self.relayed += len(batch.events)
                self._sink(batch.events, batch.dp_rank)

    def _undecodable(self, seq: int | None, why: str) -> None:
        self.undecodable += 1
        if self.undecodable == 1:
            log.error(
                "Dropped an SGLang KV event batch that decodes as neither tagged arrays nor tagged maps "
                "seq=%s error=%s; the relay goes on, but the router misses these events: check that the "
                "installed SGLang is inside the window `python -m dynamo_worker.sglang.compat` checks "
                "(further undecodable batches are counted, not logged)",
                seq,
                why,
            )
        else:
            log.debug("Dropped an undecodable SGLang KV event batch seq=%s count=%s", seq, self.undecodable)

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():  # a task that ended has said why
            await cancel_and_wait(self._task)
            self._task = None
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None


def _report_end(task: asyncio.Task[None]) -> None:
    """A relay that stops for any reason other than ``stop()`` says so: KV routing to this worker is
    then load-only."""
    if task.cancelled():
        return
    error = task.exception()
    log.error(
        "SGLang KV event relay stopped error=%r; the router gets no more KV events from this worker "
        "(routing to it uses load only) until it restarts",
        error,
        exc_info=error,
    )
