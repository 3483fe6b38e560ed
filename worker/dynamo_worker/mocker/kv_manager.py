"""The mocker's KV block manager: paged KV cache with prefix caching and LRU eviction. Pure (no I/O).

The cache has ``total_blocks`` blocks of ``page_size`` tokens. A sequence holds its full blocks by
hash (``hash_token_blocks`` from the protocol, so routers compute the same hashes) and at most one
partial block (its unfinished tail, never shared). A full block is shared by every sequence with the
same prefix (reference counted). When a sequence is freed its blocks stay cached, unreferenced, in an
LRU list (leaves before their parents, so a prefix is never evicted before its extensions); a new block
evicts the least recently used cached one when the cache is full.

A LoRA adapter's sequences live in a prefix-cache namespace of their own, as in SGLang: their blocks
chain from the adapter's seed (``hash_token_blocks(..., lora_name=...)``), so they are never shared with
the base model's or another adapter's, and their ``BlockStored`` events name the adapter.

Every change a router must know is returned as protocol events, in the order it happened:
``BlockStored`` (with parent hash, block hashes and token ids) when a block is filled for the first
time, ``BlockRemoved`` when a cached block is evicted, ``AllBlocksCleared`` on ``clear``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from dynamo_worker.protocol import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, hash_token_blocks

__all__ = ["Allocation", "BlockManager", "CacheFullError"]


class CacheFullError(RuntimeError):
    pass


@dataclass(frozen=True)
class Allocation:
    cached_tokens: int  # prompt tokens found in the prefix cache (never the whole prompt)
    events: list[KvEvent]


@dataclass
class _Seq:
    hashes: list[int]  # full blocks, in order (each holds one reference)
    tokens: list[int]  # every token with KV in this sequence
    partial: bool = False  # holds a slot for an unfinished tail block
    lora: str | None = None  # the adapter whose namespace holds its blocks


@dataclass
class BlockManager:
    total_blocks: int
    page_size: int
    _refs: dict[int, int] = field(default_factory=dict)  # hash -> references (0: cached only)
    _lru: OrderedDict[int, None] = field(default_factory=OrderedDict)  # unreferenced, oldest first
    _partials: int = 0
    _seqs: dict[str, _Seq] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.total_blocks < 1 or self.page_size < 1:
            raise ValueError("total_blocks and page_size must be >= 1")

    # --- observation -----------------------------------------------------------------------------

    @property
    def active_blocks(self) -> int:
        """Blocks referenced by a running sequence (full and partial)."""
        return len(self._refs) - len(self._lru) + self._partials

    @property
    def cached_blocks(self) -> int:
        """Full blocks that hold KV (referenced or not)."""
        return len(self._refs)

    @property
    def free_blocks(self) -> int:
        """Blocks a new sequence can get (empty ones plus evictable cached ones)."""
        return self.total_blocks - self.active_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def has_seq(self, seq_id: str) -> bool:
        return seq_id in self._seqs

    def seq_tokens(self, seq_id: str) -> int:
        return len(self._seqs[seq_id].tokens)

    def cached_prefix_tokens(self, tokens: Sequence[int], lora: str | None = None) -> int:
        hits = 0
        for h in hash_token_blocks(tokens, self.page_size, lora_name=lora):
            if h not in self._refs:
                break
            hits += 1
        return min(hits * self.page_size, max(len(tokens) - 1, 0))

    # --- changes ---------------------------------------------------------------------------------

    def _pin(self, h: int) -> None:
        self._refs[h] += 1
        self._lru.pop(h, None)

    def _take_slot(self, events: list[KvEvent]) -> bool:
        if len(self._refs) + self._partials < self.total_blocks:
            return True
        if not self._lru:
            return False
        victim, _ = self._lru.popitem(last=False)
        del self._refs[victim]
        if events and isinstance(events[-1], BlockRemoved):
            events[-1] = BlockRemoved(block_hashes=[*events[-1].block_hashes, victim])
        else:
            events.append(BlockRemoved(block_hashes=[victim]))
        return True

    def allocate(self, seq_id: str, tokens: Sequence[int], lora: str | None = None) -> Allocation | None:
        """Give ``seq_id`` the KV of ``tokens`` (its prompt), reusing the cached prefix of the same
        adapter (``lora``; None: the base model). Returns None (changing nothing) when there is not
        enough room."""
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id} already holds blocks")
        page = self.page_size
        hashes = hash_token_blocks(tokens, page, lora_name=lora)
        hits = 0
        while hits < len(hashes) and hashes[hits] in self._refs:
            hits += 1
        needed = len(hashes) - hits + (1 if len(tokens) % page else 0)
        pinned_from_lru = sum(1 for h in hashes[:hits] if h in self._lru)
        if needed > self.free_blocks - pinned_from_lru:
            return None
        for h in hashes[:hits]:
            self._pin(h)
        events: list[KvEvent] = []
        run_start: int | None = None
        for i in range(hits, len(hashes) + 1):
            block = hashes[i] if i < len(hashes) else None
            if block is None or block in self._refs:  # end of a run of new blocks
                if run_start is not None:
                    events.append(
                        BlockStored(
                            parent_hash=hashes[run_start - 1] if run_start > 0 else None,
                            block_hashes=hashes[run_start:i],
                            token_ids=list(tokens[run_start * page : i * page]),
                            lora_name=lora,
                        )
                    )
                    run_start = None
                if block is not None:
                    self._pin(block)
                continue
            if not self._take_slot(events):  # cannot happen: capacity was checked above
                raise CacheFullError("no free KV block although capacity was checked")
            self._refs[block] = 1
            if run_start is None:
                run_start = i
        seq = _Seq(hashes=list(hashes), tokens=list(tokens), lora=lora)
        if len(tokens) % page:
            if not self._take_slot(events):
                raise CacheFullError("no free KV block although capacity was checked")
            self._partials += 1
            seq.partial = True
        self._seqs[seq_id] = seq
        cached = min(hits * page, max(len(tokens) - 1, 0))
        return Allocation(cached_tokens=cached, events=events)

    def append(self, seq_id: str, token: int) -> list[KvEvent] | None:
        """Add one generated token's KV to ``seq_id``. Returns the events, or None (changing
        nothing) when the token needs a new block and none is free: the caller preempts."""
        seq = self._seqs[seq_id]
        events: list[KvEvent] = []
        if not seq.partial:
            if not self._take_slot(events):
                return None
            self._partials += 1
            seq.partial = True
        seq.tokens.append(token)
        if len(seq.tokens) % self.page_size == 0:
            block = seq.tokens[-self.page_size :]
            parent = seq.hashes[-1] if seq.hashes else None
            h = hash_token_blocks(block, self.page_size, parent, lora_name=seq.lora)[0]
            self._partials -= 1
            seq.partial = False
            seq.hashes.append(h)
            if h in self._refs:
                self._pin(h)
            else:
                self._refs[h] = 1
                events.append(
                    BlockStored(
                        parent_hash=parent, block_hashes=[h], token_ids=list(block), lora_name=seq.lora
                    )
                )
        return events

    def free(self, seq_id: str) -> None:
        """Release ``seq_id``'s blocks; full ones stay cached (most recently used, leaves first)."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            return
        for h in reversed(seq.hashes):
            self._refs[h] -= 1
            if self._refs[h] == 0:
                self._lru[h] = None
                self._lru.move_to_end(h)
        if seq.partial:
            self._partials -= 1

    def clear(self) -> list[KvEvent]:
        """Drop every cached block (only when no sequence holds blocks)."""
        if self._seqs:
            raise ValueError("cannot clear the KV cache while sequences hold blocks")
        self._refs.clear()
        self._lru.clear()
        return [AllBlocksCleared()]
