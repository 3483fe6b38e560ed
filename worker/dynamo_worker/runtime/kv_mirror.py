"""What a worker has told the event plane it holds: a mirror of its published KV events. Pure.

A frontend that starts (or restarts, or scales out) after the workers have filled their caches has
seen none of their ``BlockStored`` events. Every worker keeps this mirror of the events it published
(whatever the engine: mocker or SGLang, both publish through ``runtime.events.KvEventPublisher``) and
answers a ``KvSnapshotRequest`` from it: the blocks stored and not since removed, per dp rank, as
``BlockStored`` events with every parent before its children, so a ``KvIndex`` can place them all.

Tiers follow the index's model (``router.index``): a block is held in the set of media it was stored
in and not since removed from, and is gone when that set is empty. The snapshot sends one
``BlockStored`` per tier a block is held in (a GPU block backed up in host memory: two).

Memory: one entry per block the engine holds (its hash, its parent's and its ``page_size`` tokens, and
the LoRA adapter whose prefix cache holds it), bounded by the engine's KV cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from dynamo_worker.protocol import MEDIA, AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, Medium

__all__ = ["KvMirror"]


class _Block:
    """One block the worker told of (a plain class: a prefill stores hundreds at once)."""

    __slots__ = ("lora", "media", "parent", "tokens")

    def __init__(self, parent: int | None, tokens: list[int], lora: str | None) -> None:
        self.parent = parent
        self.tokens = tokens
        self.media: set[Medium] = set()
        self.lora = lora


@dataclass
class KvMirror:
    ranks: dict[int, dict[int, _Block]] = field(default_factory=dict)  # rank -> engine hash -> block

    def apply(self, events: list[KvEvent], dp_rank: int = 0) -> None:
        blocks = self.ranks.setdefault(dp_rank, {})
        for event in events:
            if isinstance(event, BlockStored):
                n = len(event.block_hashes)
                if n == 0:
                    continue
                page = len(event.token_ids) // n
                parent = event.parent_hash
                for i, h in enumerate(event.block_hashes):
                    tokens = event.token_ids[i * page : (i + 1) * page]
                    block = blocks.get(h)
                    if block is None or block.parent != parent or block.tokens != tokens:
                        block = blocks[h] = _Block(parent, tokens, event.lora_name)  # new content
                    block.media.add(event.medium)
                    parent = h
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    block = blocks.get(h)
                    if block is not None:
                        block.media.discard(event.medium)
                        if not block.media:
                            del blocks[h]
            elif isinstance(event, AllBlocksCleared):
                blocks.clear()

    def block_count(self, dp_rank: int | None = None) -> int:
        """Blocks held in any tier."""
        if dp_rank is not None:
            return len(self.ranks.get(dp_rank, {}))
        return sum(len(b) for b in self.ranks.values())

    def stored_events(self, dp_rank: int, max_blocks: int = 1000) -> Iterator[list[BlockStored]]:
        """The rank's blocks as ``BlockStored`` events, parents first (with every tier of a parent
        before its children), one per tier a block is held in, in lists of at most ``max_blocks``
        events' blocks. A chain of blocks in one tier becomes one event."""
        blocks = self.ranks.get(dp_rank, {})
        emitted: set[int] = set()
        out: list[BlockStored] = []
        count = 0
        for start in blocks:
            if start in emitted:
                continue
            # walk up to the first ancestor not yet emitted (or absent), then emit downwards
            chain = [start]
            parent = blocks[start].parent
            while parent is not None and parent in blocks and parent not in emitted:
                chain.append(parent)
                parent = blocks[parent].parent
            chain.reverse()
            for h in chain:
                emitted.add(h)
                b = blocks[h]
                for medium in (m for m in MEDIA if m in b.media):
                    _extend(out, h, b, medium)
                    count += 1
                    if count >= max_blocks:
                        yield out
                        out, count = [], 0
        if out:
            yield out


def _extend(out: list[BlockStored], h: int, b: _Block, medium: Medium) -> None:
    """Add block ``h`` in ``medium`` to ``out``: onto an event of the same tier and adapter it continues
    (looking back past the other tiers of its parent), else as a new event."""
    for i in range(len(out) - 1, max(len(out) - len(MEDIA), 0) - 1, -1):
        last = out[i]
        same = last.medium == medium and last.lora_name == b.lora
        if same and last.block_hashes[-1] == b.parent and len(last.block_hashes) < 64:
            out[i] = last.model_copy(
                update={"block_hashes": [*last.block_hashes, h], "token_ids": [*last.token_ids, *b.tokens]}
            )
            return
    out.append(
        BlockStored(
            parent_hash=b.parent, block_hashes=[h], token_ids=b.tokens, medium=medium, lora_name=b.lora
        )
    )
