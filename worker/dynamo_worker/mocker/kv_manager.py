"""The mocker's KV block manager: paged KV cache with prefix caching and LRU eviction. Pure (no I/O).

More: docs/module-notes.md (dynamo_worker.mocker.kv_manager)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from dynamo_api.errors import DynamoError

from dynamo_worker.protocol import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    Medium,
    hash_token_blocks,
)

__all__ = ["Allocation", "BlockManager", "CacheFullError"]


class CacheFullError(DynamoError, RuntimeError):
    pass


@dataclass(frozen=True)
class Allocation:
    cached_tokens: int  # prompt tokens found in the prefix cache, any tier (never the whole prompt)
    events: list[KvEvent]
    host_cached_tokens: int = 0  # of which loaded back from host memory


@dataclass(frozen=True)
class _HostCopy:
    parent: int | None
    tokens: list[int]
    lora: str | None = None


@dataclass
class _SeqBlocks:
    """The KV blocks one sequence holds in the manager (the engine's ``Seq`` is the request itself)."""

    hashes: list[int]  # full blocks, in order (each holds one reference)
    tokens: list[int]  # every token with KV in this sequence
    partial: bool = False  # holds a slot for an unfinished tail block
    lora: str | None = None  # the adapter whose namespace holds its blocks


@dataclass
class BlockManager:
    total_blocks: int
    page_size: int
    host_blocks: int = 0  # HiCache's host memory in blocks; 0: no host tier
    _refs: dict[int, int] = field(default_factory=dict)  # hash -> references (0: cached only)
    _lru: OrderedDict[int, None] = field(default_factory=OrderedDict)  # unreferenced, oldest first
    _partials: int = 0
    _seqs: dict[str, _SeqBlocks] = field(default_factory=dict)
    _host: dict[int, _HostCopy] = field(default_factory=dict)  # blocks with a host copy
    _host_lru: OrderedDict[int, None] = field(default_factory=OrderedDict)  # host-only, oldest first

    def __post_init__(self) -> None:
        if self.total_blocks < 1 or self.page_size < 1:
            raise ValueError("total_blocks and page_size must be >= 1")
        if self.host_blocks < 0:
            raise ValueError("host_blocks must be >= 0")

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

    @property
    def host_held_blocks(self) -> int:
        """Blocks with a copy in host memory (also on the GPU, or only there)."""
        return len(self._host)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def has_seq(self, seq_id: str) -> bool:
        return seq_id in self._seqs

    def seq_tokens(self, seq_id: str) -> int:
        return len(self._seqs[seq_id].tokens)

    def cached_prefix_tokens(self, tokens: Sequence[int], lora: str | None = None) -> int:
        """Prompt tokens a request (of adapter ``lora``) would find cached, on the GPU or in host memory."""
        gpu, host = self.prefix_hits(hash_token_blocks(tokens, self.page_size, lora_name=lora))
        return min((gpu + host) * self.page_size, max(len(tokens) - 1, 0))

    def prefix_hits(self, hashes: Sequence[int]) -> tuple[int, int]:
        """Leading blocks on the GPU, then the following ones with a host copy."""
        gpu = 0
        while gpu < len(hashes) and hashes[gpu] in self._refs:
            gpu += 1
        host = gpu
        while host < len(hashes) and hashes[host] in self._host:
            host += 1
        return gpu, host - gpu

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
        if victim in self._host:  # demoted: its host copy stays, now the only one
            self._host_lru[victim] = None
        _removed(events, victim, "gpu")
        return True

    def _back_up(
        self, parent: int | None, hashes: Sequence[int], tokens: Sequence[int], lora: str | None = None
    ) -> list[KvEvent]:
        """Write-through: host copies of a run of new GPU blocks (``tokens`` is their content), as far as
        host memory has room; the events (host removals of evicted copies, then one host store)."""
        events: list[KvEvent] = []
        if not self.host_blocks or (parent is not None and parent not in self._host):
            return events
        page, copied, prev = self.page_size, 0, parent
        for i, h in enumerate(hashes):
            if h not in self._host:
                if len(self._host) >= self.host_blocks:
                    if not self._host_lru:
                        break  # host memory holds only copies of GPU blocks: no room for this one
                    victim, _ = self._host_lru.popitem(last=False)
                    del self._host[victim]
                    _removed(events, victim, "host")
                self._host[h] = _HostCopy(prev, list(tokens[i * page : (i + 1) * page]), lora)
            prev = h
            copied += 1
        if copied:
            stored = BlockStored(
                parent_hash=parent,
                block_hashes=list(hashes[:copied]),
                token_ids=list(tokens[: copied * page]),
                medium="host",
                lora_name=lora,
            )
            events.append(stored)
        return events

    def allocate(self, seq_id: str, tokens: Sequence[int], lora: str | None = None) -> Allocation | None:
        """Give ``seq_id`` the KV of ``tokens`` (its prompt), reusing the cached prefix of the same
        adapter (``lora``; None: the base model). Returns None (changing nothing) when there is not
        enough room."""
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id} already holds blocks")
        page = self.page_size
        hashes = hash_token_blocks(tokens, page, lora_name=lora)
        hits, host_hits = self.prefix_hits(hashes)
        needed = len(hashes) - hits + (1 if len(tokens) % page else 0)  # host hits load into GPU blocks
        pinned_from_lru = sum(1 for h in hashes[:hits] if h in self._lru)
        if needed > self.free_blocks - pinned_from_lru:
            return None
        for h in hashes[:hits]:
            self._pin(h)
        events: list[KvEvent] = []
        loaded = hits + host_hits
        if host_hits:
            self._load_back(hashes, hits, loaded, events)
        run_start: int | None = None
        for i in range(loaded, len(hashes) + 1):
            block = hashes[i] if i < len(hashes) else None
            if block is None or block in self._refs:  # end of a run of new blocks
                if run_start is not None:
                    parent = hashes[run_start - 1] if run_start > 0 else None
                    run_tokens = list(tokens[run_start * page : i * page])
                    events.append(
                        BlockStored(
                            parent_hash=parent,
                            block_hashes=hashes[run_start:i],
                            token_ids=run_tokens,
                            lora_name=lora,
                        )
                    )
                    events += self._back_up(parent, hashes[run_start:i], run_tokens, lora)
                    run_start = None
                if block is not None:
                    self._pin(block)
                continue
            if not self._take_slot(events):  # cannot happen: capacity was checked above
                raise CacheFullError("no free KV block although capacity was checked")
            self._refs[block] = 1
            self._host_lru.pop(block, None)  # a host copy past a missing block: on the GPU too now
            if run_start is None:
                run_start = i
        seq = _SeqBlocks(hashes=list(hashes), tokens=list(tokens), lora=lora)
        if len(tokens) % page:
            if not self._take_slot(events):
                raise CacheFullError("no free KV block although capacity was checked")
            self._partials += 1
            seq.partial = True
        self._seqs[seq_id] = seq
        on_gpu = min(hits * page, max(len(tokens) - 1, 0))
        cached = min(loaded * page, max(len(tokens) - 1, 0))
        return Allocation(cached_tokens=cached, events=events, host_cached_tokens=cached - on_gpu)

    def _load_back(self, hashes: Sequence[int], start: int, end: int, events: list[KvEvent]) -> None:
        """Host hits ``hashes[start:end]`` into GPU blocks (their host copies stay): one GPU store."""
        for h in hashes[start:end]:
            if not self._take_slot(events):  # cannot happen: capacity was checked by the caller
                raise CacheFullError("no free KV block although capacity was checked")
            self._refs[h] = 1
            self._host_lru.pop(h, None)  # on the GPU again: its host copy is not evictable
        first = self._host[hashes[start]]
        tokens = [t for h in hashes[start:end] for t in self._host[h].tokens]
        events.append(
            BlockStored(
                parent_hash=first.parent,
                block_hashes=list(hashes[start:end]),
                token_ids=tokens,
                lora_name=first.lora,
            )
        )

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
                self._host_lru.pop(h, None)  # a host-only block computed again: on the GPU too now
                events.append(
                    BlockStored(
                        parent_hash=parent, block_hashes=[h], token_ids=list(block), lora_name=seq.lora
                    )
                )
                events += self._back_up(parent, [h], block, seq.lora)
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
        self._host.clear()
        self._host_lru.clear()
        return [AllBlocksCleared()]


def _removed(events: list[KvEvent], block: int, medium: Medium) -> None:
    """Record ``block``'s removal from ``medium``, into the last event when it is a removal from there."""
    last = events[-1] if events else None
    if isinstance(last, BlockRemoved) and last.medium == medium:
        last.block_hashes.append(block)  # built here, not yet handed out: no copy (and model) per block
    else:
        events.append(BlockRemoved(block_hashes=[block], medium=medium))
