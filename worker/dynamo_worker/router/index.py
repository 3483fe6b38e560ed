"""Which worker caches which prompt prefix: a prefix index of block hashes, fed by KV events.

Blocks are identified by *our* chained hashes (``protocol.hash_token_blocks``): block i's hash covers
its parent's hash and its own tokens, so one hash names a whole prefix and a flat map
``hash -> workers`` behaves like a radix tree whose edges are blocks. A worker's overlap with a prompt
is the number of leading prompt blocks it holds, counted until the first block it lacks.

Engines name blocks with their own hashes (SGLang's differ from ours), so a ``BlockStored`` event is
re-hashed from its ``token_ids`` under our hash of its parent, and the engine hash is remembered so a
later ``BlockRemoved`` (which carries engine hashes only) can be mapped back.

Consistency: every worker's batches carry a sequence number growing by one. When a batch skips
numbers, events were lost and this worker's entries can no longer be trusted: they are all dropped,
and the batch and the ones after it rebuild the state (blocks whose parent is unknown are skipped
until their prefix is stored again). A worker that leaves discovery is dropped the same way.

The index is pure state: no I/O, no clock. ``router.kv_events`` feeds it from the event plane.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from dynamo_worker.protocol import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    hash_token_blocks,
)

log = logging.getLogger(__name__)

__all__ = ["ApplyResult", "KvIndex"]


@dataclass
class _WorkerBlocks:
    page_size: int
    last_seq: int | None = None
    engine_to_ours: dict[int, int] = field(default_factory=dict)
    refs: dict[int, int] = field(default_factory=dict)  # our hash -> engine hashes naming it


@dataclass(frozen=True)
class ApplyResult:
    """What applying one batch did: ``gap`` is True when events were lost before it."""

    gap: bool
    stored: int
    removed: int
    skipped: int


class KvIndex:
    """Block-hash prefix index over all workers of one namespace."""

    def __init__(self) -> None:
        self._workers: dict[str, _WorkerBlocks] = {}
        self._holders: dict[int, set[str]] = {}

    # --- membership -------------------------------------------------------------------------

    def add_worker(self, worker_id: str, page_size: int) -> None:
        """Start tracking a worker (idempotent); events of unknown workers are ignored."""
        if worker_id not in self._workers:
            self._workers[worker_id] = _WorkerBlocks(page_size=page_size)

    def remove_worker(self, worker_id: str) -> None:
        """Forget a worker and every block it held."""
        self._clear(worker_id)
        self._workers.pop(worker_id, None)

    def workers(self) -> list[str]:
        return list(self._workers)

    def page_size(self, worker_id: str) -> int | None:
        w = self._workers.get(worker_id)
        return w.page_size if w else None

    def block_count(self, worker_id: str) -> int:
        w = self._workers.get(worker_id)
        return len(w.refs) if w else 0

    # --- events -----------------------------------------------------------------------------

    def apply(self, batch: KvEventBatch) -> ApplyResult | None:
        """Apply one worker's event batch; None when the worker is not tracked."""
        w = self._workers.get(batch.instance_id)
        if w is None:
            return None
        gap = w.last_seq is not None and batch.seq != w.last_seq + 1
        if gap:
            log.warning(
                "Dropped KV state after an event gap worker=%s expected_seq=%d got_seq=%d",
                batch.instance_id,
                (w.last_seq or 0) + 1,
                batch.seq,
            )
            self._clear(batch.instance_id)
        w.last_seq = batch.seq
        stored = removed = skipped = 0
        for event in batch.events:
            if isinstance(event, BlockStored):
                n = self._store(batch.instance_id, w, event)
                stored += n
                skipped += len(event.block_hashes) - n
            elif isinstance(event, BlockRemoved):
                removed += self._remove(batch.instance_id, w, event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self._clear(batch.instance_id)
        return ApplyResult(gap=gap, stored=stored, removed=removed, skipped=skipped)

    def _store(self, worker_id: str, w: _WorkerBlocks, event: BlockStored) -> int:
        if event.parent_hash is None:
            parent = None
        else:
            parent = w.engine_to_ours.get(event.parent_hash)
            if parent is None:
                return 0  # its prefix is unknown (lost in a gap or evicted): cannot be placed
        ours = hash_token_blocks(event.token_ids, w.page_size, parent)
        for engine_hash, our_hash in zip(event.block_hashes, ours, strict=False):
            previous = w.engine_to_ours.get(engine_hash)
            if previous == our_hash:
                continue
            if previous is not None:
                self._release(worker_id, w, previous)
            w.engine_to_ours[engine_hash] = our_hash
            w.refs[our_hash] = w.refs.get(our_hash, 0) + 1
            self._holders.setdefault(our_hash, set()).add(worker_id)
        return min(len(ours), len(event.block_hashes))

    def _remove(self, worker_id: str, w: _WorkerBlocks, engine_hashes: Iterable[int]) -> int:
        n = 0
        for engine_hash in engine_hashes:
            our_hash = w.engine_to_ours.pop(engine_hash, None)
            if our_hash is None:
                continue
            self._release(worker_id, w, our_hash)
            n += 1
        return n

    def _release(self, worker_id: str, w: _WorkerBlocks, our_hash: int) -> None:
        left = w.refs.get(our_hash, 0) - 1
        if left > 0:
            w.refs[our_hash] = left  # the engine still holds this content under another hash
            return
        w.refs.pop(our_hash, None)
        self._discard(our_hash, worker_id)

    def _clear(self, worker_id: str) -> None:
        w = self._workers.get(worker_id)
        if w is None:
            return
        for our_hash in w.refs:
            self._discard(our_hash, worker_id)
        w.engine_to_ours.clear()
        w.refs.clear()

    def _discard(self, our_hash: int, worker_id: str) -> None:
        holders = self._holders.get(our_hash)
        if holders is None:
            return
        holders.discard(worker_id)
        if not holders:
            del self._holders[our_hash]

    # --- queries ----------------------------------------------------------------------------

    def overlaps(self, block_hashes: Sequence[int], workers: Iterable[str]) -> dict[str, int]:
        """For each worker, how many leading blocks of ``block_hashes`` it holds."""
        result = {w: 0 for w in workers}
        alive = set(result)
        for h in block_hashes:
            holders = self._holders.get(h)
            if not holders:
                break
            alive &= holders
            if not alive:
                break
            for w in alive:
                result[w] += 1
        return result
