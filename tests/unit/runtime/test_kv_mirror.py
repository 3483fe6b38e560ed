"""A worker's mirror of its published KV events, which answers snapshot requests: stored blocks not
since removed, per dp rank, parents before children, so a ``KvIndex`` fed only the snapshot holds what
one fed every event holds, in every tier (HiCache's host memory: backups, demotions, losses)."""

from __future__ import annotations

from dynamo_worker.protocol import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    KvSnapshotPart,
    hash_token_blocks,
)
from dynamo_worker.router.index import KvIndex, TierOverlap
from dynamo_worker.runtime.kv_mirror import KvMirror

PAGE = 4
TOKENS = list(range(100, 140))  # 10 blocks


def _events() -> list:
    return [
        BlockStored(parent_hash=None, block_hashes=[11, 12], token_ids=TOKENS[:8]),
        BlockStored(parent_hash=12, block_hashes=[13, 14, 15], token_ids=TOKENS[8:20]),
        BlockStored(parent_hash=None, block_hashes=[21], token_ids=[1, 2, 3, 4]),
        BlockRemoved(block_hashes=[15, 21]),
        BlockStored(parent_hash=14, block_hashes=[16], token_ids=TOKENS[20:24]),
    ]


def test_snapshot_equals_the_event_history():
    mirror = KvMirror()
    mirror.apply(_events())
    assert mirror.block_count() == 5
    live = KvIndex()
    live.add_worker("w", PAGE)
    live.apply(KvEventBatch(instance_id="w", seq=0, events=_events()))
    late = KvIndex()
    late.add_worker("w", PAGE)
    late.begin_sync("w")
    parts = [
        KvSnapshotPart(instance_id="w", next_seq=1, part=i, last=False, events=events)
        for i, events in enumerate(mirror.stored_events(0, max_blocks=2))
    ]
    assert len(parts) == 3  # 5 blocks in parts of at most 2
    late.end_sync("w", parts)
    assert late.block_count("w") == live.block_count("w") == 5
    prompt = hash_token_blocks(TOKENS, PAGE)  # 11 12 13 14 match; 16 holds other tokens than block 4
    assert late.overlaps(prompt, [("w", 0)]) == live.overlaps(prompt, [("w", 0)]) == {("w", 0): 4}


def test_a_parent_stored_again_after_its_child_is_still_emitted_first():
    mirror = KvMirror()
    mirror.apply([BlockStored(parent_hash=None, block_hashes=[1, 2], token_ids=TOKENS[:8])])
    mirror.apply([BlockRemoved(block_hashes=[1])])
    mirror.apply([BlockStored(parent_hash=None, block_hashes=[1], token_ids=TOKENS[:4])])
    order = [h for events in mirror.stored_events(0) for e in events for h in e.block_hashes]
    assert order == [1, 2]


def test_cleared_and_ranks():
    mirror = KvMirror()
    mirror.apply(_events()[:1], dp_rank=0)
    mirror.apply(_events()[:1], dp_rank=1)
    mirror.apply([AllBlocksCleared()], dp_rank=0)
    assert (mirror.block_count(0), mirror.block_count(1)) == (0, 2)


def _tiered_events() -> list:
    """A GPU chain backed up in host memory, its tail demoted, a host-only chain (a storage prefetch),
    one host copy lost."""
    return [
        BlockStored(parent_hash=None, block_hashes=[11, 12, 13, 14], token_ids=TOKENS[:16]),
        BlockStored(parent_hash=None, block_hashes=[11, 12, 13, 14], token_ids=TOKENS[:16], medium="host"),
        BlockRemoved(block_hashes=[13, 14]),  # demoted: still in host memory
        BlockStored(parent_hash=14, block_hashes=[15, 16], token_ids=TOKENS[16:24], medium="host"),
        BlockRemoved(block_hashes=[16], medium="host"),  # lost
        BlockStored(parent_hash=None, block_hashes=[31], token_ids=[1, 2, 3, 4], medium="disk"),
    ]


def test_snapshot_carries_every_tier():
    mirror = KvMirror()
    mirror.apply(_tiered_events())
    live = KvIndex()
    live.add_worker("w", PAGE)
    live.apply(KvEventBatch(instance_id="w", seq=0, events=_tiered_events()))
    late = KvIndex()
    late.add_worker("w", PAGE)
    late.begin_sync("w")
    parts = [
        KvSnapshotPart(instance_id="w", next_seq=1, part=i, last=False, events=events)
        for i, events in enumerate(mirror.stored_events(0, max_blocks=3))
    ]
    late.end_sync("w", parts)
    prompt = hash_token_blocks(TOKENS, PAGE)
    expected = TierOverlap(gpu=2, host=3)  # 11 12 on the GPU, 13 14 15 in host memory, 16 lost
    assert late.tier_overlaps(prompt, ["w"]) == live.tier_overlaps(prompt, ["w"]) == {"w": expected}
    for medium in ("gpu", "host", "disk"):
        assert late.block_count("w", medium=medium) == live.block_count("w", medium=medium)
    assert [late.block_count("w", medium=m) for m in ("gpu", "host", "disk")] == [2, 5, 1]


def test_a_snapshot_keeps_each_blocks_adapter():
    mirror = KvMirror()
    base = BlockStored(parent_hash=None, block_hashes=[1, 2], token_ids=TOKENS[:8])
    tuned = BlockStored(parent_hash=None, block_hashes=[7], token_ids=TOKENS[:4], lora_name="a1")
    child = BlockStored(parent_hash=7, block_hashes=[8], token_ids=TOKENS[4:8], lora_name="a1")
    mirror.apply([base, tuned, child])
    late = KvIndex()
    late.add_worker("w", PAGE)
    late.begin_sync("w")
    (events,) = mirror.stored_events(0)
    late.end_sync("w", [KvSnapshotPart(instance_id="w", next_seq=1, events=events)])
    for lora in (None, "a1"):
        hashes = hash_token_blocks(TOKENS[:8], PAGE, lora_name=lora)
        assert late.overlaps(hashes, [("w", 0)]) == {("w", 0): 2}
    assert late.overlaps(hash_token_blocks(TOKENS[:8], PAGE, lora_name="a2"), [("w", 0)]) == {("w", 0): 0}
