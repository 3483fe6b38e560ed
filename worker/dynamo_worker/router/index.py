"""Which worker caches which prompt prefix, and in which tier: a prefix index of block hashes, fed by
KV events.

More: docs/module-notes.md (dynamo_worker.router.index)."""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynamo_worker.protocol import (
    MEDIA,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    KvSnapshotPart,
    Medium,
    hash_token_blocks,
)

log = logging.getLogger(__name__)

__all__ = ["ApplyResult", "KvIndex", "Target", "TierOverlap"]

Target = tuple[str, int]  # (instance_id, dp_rank)
MAX_SYNC_BUFFER = 10_000  # batches buffered per worker while its snapshot is awaited
BIT: dict[Medium, int] = {m: 1 << i for i, m in enumerate(MEDIA)}  # gpu 1, host 2, disk 4
GPU = BIT["gpu"]


def _best(mask: int) -> int:
    """The index in ``MEDIA`` of the fastest tier in ``mask`` (non-zero)."""
    return (mask & -mask).bit_length() - 1


@dataclass(frozen=True)
class TierOverlap:
    """A target's leading prompt blocks, by the fastest tier it holds each in."""

    gpu: int = 0
    host: int = 0
    disk: int = 0

    @property
    def blocks(self) -> int:
        return self.gpu + self.host + self.disk


@dataclass
class _Cache:
    """The blocks of one target (a worker's dp rank)."""

    engine_to_ours: dict[int, int] = field(default_factory=dict)
    engine_tiers: dict[int, int] = field(default_factory=dict)  # engine hash -> tiers it is held in
    # our hash -> per tier (MEDIA order), the engine hashes holding this content there
    refs: dict[int, list[int]] = field(default_factory=dict)
    held: list[int] = field(default_factory=lambda: [0] * len(MEDIA))  # our hashes held per tier
    predicted: dict[int, float] = field(default_factory=dict)  # our hash -> expires_at

    def mask(self, our_hash: int) -> int:
        """The tiers holding ``our_hash`` (stored, not predicted)."""
        mask = 0
        for i, n in enumerate(self.refs.get(our_hash, ())):
            if n:
                mask |= 1 << i
        return mask


@dataclass
class _Worker:
    page_size: int
    dp_size: int = 1
    last_seq: int | None = None
    syncing: bool = False
    buffer: list[KvEventBatch] = field(default_factory=list)
    ranks: dict[int, _Cache] = field(default_factory=dict)

    def cache(self, rank: int) -> _Cache:
        c = self.ranks.get(rank)
        if c is None:
            c = self.ranks[rank] = _Cache()
        return c


@dataclass(frozen=True)
class ApplyResult:
    """What applying one batch did: ``gap`` is True when events were lost before it. ``removed``
    counts blocks that left a tier, of which ``demoted`` stayed held in another."""

    gap: bool
    stored: int
    removed: int
    skipped: int
    buffered: bool = False
    demoted: int = 0


class KvIndex:
    """Block-hash prefix index over all workers (and their dp ranks) of one namespace."""

    def __init__(self) -> None:
        self._workers: dict[str, _Worker] = {}
        self._holders: dict[int, dict[Target, int]] = {}  # our hash -> target -> tiers (predicted: gpu)
        self._expiries: list[tuple[float, int, str, int]] = []  # (expires_at, hash, worker, rank)
        self.events_seen: dict[str, int] = {}  # worker -> batches received (for "no events" warnings)

    # --- membership -------------------------------------------------------------------------

    def add_worker(self, worker_id: str, page_size: int, dp_size: int = 1) -> None:
        """Start tracking a worker (idempotent); events of unknown workers are ignored."""
        if worker_id not in self._workers:
            self._workers[worker_id] = _Worker(page_size=page_size, dp_size=dp_size)

    def remove_worker(self, worker_id: str) -> None:
        """Forget a worker and every block it held."""
        self._clear(worker_id)
        self._workers.pop(worker_id, None)
        self.events_seen.pop(worker_id, None)

    def workers(self) -> list[str]:
        return list(self._workers)

    def targets(self) -> list[Target]:
        """Every cache tracked: (worker, dp rank) for each rank of each worker."""
        return [(w, rank) for w, state in self._workers.items() for rank in range(state.dp_size)]

    def page_size(self, worker_id: str) -> int | None:
        w = self._workers.get(worker_id)
        return w.page_size if w else None

    def block_count(
        self,
        worker_id: str,
        dp_rank: int | None = None,
        *,
        predicted: bool = False,
        medium: Medium = "gpu",
    ) -> int:
        """Blocks the index believes the worker (or one of its ranks) holds in ``medium``: stored ones,
        plus (GPU) the predicted ones not yet confirmed when ``predicted``."""
        w = self._workers.get(worker_id)
        if w is None:
            return 0
        tier = MEDIA.index(medium)
        # a prediction ends when a GPU store confirms it: predicted and GPU-held blocks are disjoint
        with_predicted = predicted and medium == "gpu"
        if dp_rank is not None:  # one rank (a routing decision's case): no allocation per call
            c = w.ranks.get(dp_rank)
            return 0 if c is None else c.held[tier] + (len(c.predicted) if with_predicted else 0)
        return sum(c.held[tier] + (len(c.predicted) if with_predicted else 0) for c in w.ranks.values())

    # --- events -----------------------------------------------------------------------------

    def apply(self, batch: KvEventBatch) -> ApplyResult | None:
        """Apply one worker's event batch; None when the worker is not tracked."""
        w = self._workers.get(batch.instance_id)
        if w is None:
            return None
        self.events_seen[batch.instance_id] = self.events_seen.get(batch.instance_id, 0) + 1
        if w.syncing:
            if len(w.buffer) < MAX_SYNC_BUFFER:
                w.buffer.append(batch)
                return ApplyResult(gap=False, stored=0, removed=0, skipped=0, buffered=True)
            log.warning(
                "Stopped waiting for a KV snapshot worker=%s (more than %d event batches arrived "
                "meanwhile); routing on the events that follow",
                batch.instance_id,
                MAX_SYNC_BUFFER,
            )
            self.end_sync(batch.instance_id, None)
        return self._apply(batch.instance_id, w, batch)

    def _apply(self, worker_id: str, w: _Worker, batch: KvEventBatch) -> ApplyResult:
        gap = w.last_seq is not None and batch.seq != w.last_seq + 1
        if gap and batch.seq == 0:
            log.info("Dropped KV state of a restarted worker worker=%s", worker_id)
            self._clear(worker_id)
        elif gap:
            log.warning(
                "Dropped KV state after an event gap worker=%s expected_seq=%d got_seq=%d",
                worker_id,
                (w.last_seq or 0) + 1,
                batch.seq,
            )
            self._clear(worker_id)
        w.last_seq = batch.seq
        target = (worker_id, batch.dp_rank)
        c = w.cache(batch.dp_rank)
        stored = removed = skipped = demoted = 0
        for event in batch.events:
            if isinstance(event, BlockStored):
                n = self._store(target, w.page_size, c, event)
                stored += n
                skipped += len(event.block_hashes) - n
            elif isinstance(event, BlockRemoved):
                left, kept = self._remove(target, c, event.block_hashes, BIT[event.medium])
                removed += left
                demoted += kept
            elif isinstance(event, AllBlocksCleared):
                self._clear_cache(target, c)
        return ApplyResult(gap=gap, stored=stored, removed=removed, skipped=skipped, demoted=demoted)

    def _store(self, target: Target, page_size: int, c: _Cache, event: BlockStored) -> int:
        if event.parent_hash is None:
            parent = None
        else:
            parent = c.engine_to_ours.get(event.parent_hash)
            if parent is None:
                return 0  # its prefix is unknown (lost in a gap or evicted): cannot be placed
        bit = BIT[event.medium]
        ours = hash_token_blocks(event.token_ids, page_size, parent, lora_name=event.lora_name)
        for engine_hash, our_hash in zip(event.block_hashes, ours, strict=False):
            previous = c.engine_to_ours.get(engine_hash)
            if previous is not None and previous != our_hash:  # the engine reused a hash: forget the old
                self._release(target, c, engine_hash, c.engine_tiers.get(engine_hash, 0))
                previous = None
            if previous is None:
                c.engine_to_ours[engine_hash] = our_hash
                c.engine_tiers[engine_hash] = 0
            if c.engine_tiers[engine_hash] & bit:
                continue  # already known in this tier
            c.engine_tiers[engine_hash] |= bit
            counts = c.refs.setdefault(our_hash, [0] * len(MEDIA))
            tier = MEDIA.index(event.medium)
            counts[tier] += 1
            if counts[tier] == 1:
                c.held[tier] += 1
            if bit == GPU:
                c.predicted.pop(our_hash, None)  # confirmed
            # _refresh's work, inline (a prefill's chain stores hundreds of blocks): it is held now
            mask = c.mask(our_hash) | (GPU if our_hash in c.predicted else 0)
            self._holders.setdefault(our_hash, {})[target] = mask
        return min(len(ours), len(event.block_hashes))

    def _remove(self, target: Target, c: _Cache, engine_hashes: Iterable[int], bit: int) -> tuple[int, int]:
        """Take ``bit``'s tier from these blocks; (blocks that left it, of which still held elsewhere)."""
        left = kept = 0
        for engine_hash in engine_hashes:
            tiers = c.engine_tiers.get(engine_hash, 0)
            if not tiers & bit:
                continue  # unknown, or not known in this tier (e.g. a GPU copy we never saw stored)
            self._release(target, c, engine_hash, bit)
            left += 1
            kept += engine_hash in c.engine_tiers
        return left, kept

    def _release(self, target: Target, c: _Cache, engine_hash: int, bits: int) -> None:
        """Take the tiers ``bits`` from one engine hash; forget it when it is held in none."""
        our_hash = c.engine_to_ours[engine_hash]
        tiers = c.engine_tiers[engine_hash]
        counts = c.refs.get(our_hash)
        for i in range(len(MEDIA)):
            if counts is not None and bits & tiers & (1 << i):
                counts[i] -= 1  # the engine may still hold this content in this tier under another hash
                if counts[i] == 0:
                    c.held[i] -= 1
        tiers &= ~bits
        if tiers:
            c.engine_tiers[engine_hash] = tiers
        else:
            del c.engine_tiers[engine_hash]
            del c.engine_to_ours[engine_hash]
        if counts is not None and not any(counts):
            del c.refs[our_hash]
        if bits & GPU and not c.mask(our_hash) & GPU:
            c.predicted.pop(our_hash, None)  # evicted from the GPU: an older prediction no longer holds
        self._refresh(target, c, our_hash)

    def _refresh(self, target: Target, c: _Cache, our_hash: int) -> None:
        """Bring ``_holders`` in line with what ``c`` holds of ``our_hash``."""
        mask = c.mask(our_hash) | (GPU if our_hash in c.predicted else 0)
        if mask:
            self._holders.setdefault(our_hash, {})[target] = mask
        else:
            self._discard(our_hash, target)

    def _clear(self, worker_id: str) -> None:
        w = self._workers.get(worker_id)
        if w is None:
            return
        for rank, c in w.ranks.items():
            self._clear_cache((worker_id, rank), c)

    def _clear_cache(self, target: Target, c: _Cache) -> None:
        for our_hash in list(c.refs) + list(c.predicted):
            self._discard(our_hash, target)
        c.engine_to_ours.clear()
        c.engine_tiers.clear()
        c.refs.clear()
        c.held = [0] * len(MEDIA)
        c.predicted.clear()

    def _discard(self, our_hash: int, target: Target) -> None:
        holders = self._holders.get(our_hash)
        if holders is None:
            return
        holders.pop(target, None)
        if not holders:
            del self._holders[our_hash]

    # --- snapshots --------------------------------------------------------------------------

    def begin_sync(self, worker_id: str) -> None:
        """Buffer this worker's batches until ``end_sync`` (a snapshot has been asked for)."""
        w = self._workers.get(worker_id)
        if w is not None:
            w.syncing = True

    def end_sync(self, worker_id: str, parts: Sequence[KvSnapshotPart] | None) -> int:
        """Install a snapshot (``None``: none came) and apply the buffered batches it does not include.
        Returns the blocks the snapshot placed."""
        w = self._workers.get(worker_id)
        if w is None:
            return 0
        w.syncing = False
        buffered, w.buffer = w.buffer, []
        placed = 0
        if parts:
            next_seq = parts[0].next_seq
            self._clear(worker_id)
            for part in parts:
                target = (worker_id, part.dp_rank)
                c = w.cache(part.dp_rank)
                for event in part.events:
                    placed += self._store(target, w.page_size, c, event)
            w.last_seq = next_seq - 1 if next_seq > 0 else None
            buffered = [b for b in buffered if b.seq >= next_seq]
        for batch in buffered:
            self._apply(worker_id, w, batch)
        return placed

    # --- predictions ------------------------------------------------------------------------

    def predict(self, target: Target, block_hashes: Sequence[int], expires_at: float) -> None:
        """Count ``block_hashes`` as held on ``target``'s GPU until ``expires_at`` (or an event says)."""
        w = self._workers.get(target[0])
        if w is None:
            return
        c = w.cache(target[1])
        for h in block_hashes:
            if c.mask(h) & GPU:
                continue
            if c.predicted.get(h, -1.0) < expires_at:
                c.predicted[h] = expires_at
                heapq.heappush(self._expiries, (expires_at, h, target[0], target[1]))
            self._refresh(target, c, h)

    def expire(self, now: float) -> int:
        """Drop predictions whose time has come; how many."""
        n = 0
        while self._expiries and self._expiries[0][0] <= now:
            at, h, worker_id, rank = heapq.heappop(self._expiries)
            w = self._workers.get(worker_id)
            if w is None:
                continue
            c = w.ranks.get(rank)
            if c is None or c.predicted.get(h) != at:
                continue  # confirmed, refreshed or dropped since
            del c.predicted[h]
            self._refresh((worker_id, rank), c, h)
            n += 1
        return n

    # --- queries ----------------------------------------------------------------------------

    def tier_overlaps(
        self, block_hashes: Sequence[int], targets: Iterable[Target | str]
    ) -> dict[Any, TierOverlap]:
        """For each target, its leading blocks of ``block_hashes`` (held in any tier, or predicted), each
        counted in the fastest tier it is held in. A target is ``(worker, dp_rank)``; a bare worker id
        stands for its rank 0 (and keys the result as given)."""
        given = {t: (t, 0) if isinstance(t, str) else t for t in targets}
        counts = {t: [0] * len(MEDIA) for t in given.values()}
        alive = set(counts)
        for h in block_hashes:
            holders = self._holders.get(h)
            if not holders:
                break
            alive = {t for t in alive if t in holders}
            if not alive:
                break
            for t in alive:
                counts[t][_best(holders[t])] += 1
        return {g: TierOverlap(*counts[t]) for g, t in given.items()}

    def overlaps(self, block_hashes: Sequence[int], targets: Iterable[Target | str]) -> dict[Any, int]:
        """For each target, how many leading blocks of ``block_hashes`` it holds in any tier (or is
        predicted to); see ``tier_overlaps``."""
        return {t: o.blocks for t, o in self.tier_overlaps(block_hashes, targets).items()}
