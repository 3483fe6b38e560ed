"""The KV index's tiers, with the events SGLang's HiCache sends: a host store after a GPU store is a
backup (the block is in both), a GPU removal of a backed-up block a demotion (it stays as a host
block), a removal from the last tier a loss, a load-back a GPU store again; a removal is never assumed;
predictions are GPU blocks; a late frontend's snapshot gives the same tiers; a block only in host
memory takes no GPU block."""

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

PAGE = 4
TOKENS = list(range(100, 132))  # 8 blocks
ENGINE = [10_000 + i for i in range(8)]
PROMPT = hash_token_blocks(TOKENS, PAGE)


def stored(n: int, medium: str = "gpu", start: int = 0) -> BlockStored:
    parent = ENGINE[start - 1] if start else None
    return BlockStored(
        parent_hash=parent,
        block_hashes=ENGINE[start:n],
        token_ids=TOKENS[start * PAGE : n * PAGE],
        medium=medium,  # type: ignore[arg-type]
    )


def removed(first: int, last: int, medium: str = "gpu") -> BlockRemoved:
    return BlockRemoved(block_hashes=ENGINE[first:last], medium=medium)  # type: ignore[arg-type]


def index_with(*events) -> KvIndex:
    idx = KvIndex()
    idx.add_worker("a", PAGE)
    idx.apply(KvEventBatch(instance_id="a", seq=0, events=list(events)))
    return idx


def tiers(idx: KvIndex) -> TierOverlap:
    return idx.tier_overlaps(PROMPT, ["a"])["a"]


def test_a_host_store_after_a_gpu_store_is_a_backup():
    idx = index_with(stored(4), stored(4, "host"))
    assert tiers(idx) == TierOverlap(gpu=4)
    assert idx.block_count("a") == idx.block_count("a", medium="host") == 4


def test_a_gpu_removal_of_a_backed_up_block_is_a_demotion():
    idx = index_with(stored(4), stored(4, "host"), removed(2, 4))
    assert tiers(idx) == TierOverlap(gpu=2, host=2)
    assert idx.overlaps(PROMPT, ["a"]) == {"a": 4}
    assert (idx.block_count("a"), idx.block_count("a", medium="host")) == (2, 4)


def test_a_removal_from_the_last_tier_is_a_loss():
    idx = index_with(stored(4), stored(4, "host"), removed(2, 4), removed(3, 4, "host"))
    assert tiers(idx) == TierOverlap(gpu=2, host=1)
    idx = index_with(stored(4), removed(2, 4))  # no backup: the GPU removal loses the blocks
    assert tiers(idx) == TierOverlap(gpu=2)


def test_a_host_removal_of_a_block_still_on_the_gpu_leaves_it_there():
    idx = index_with(stored(4), stored(4, "host"), removed(0, 4, "host"))
    assert tiers(idx) == TierOverlap(gpu=4) and idx.block_count("a", medium="host") == 0


def test_a_load_back_makes_a_host_block_a_gpu_block_again():
    idx = index_with(stored(4), stored(4, "host"), removed(0, 4), stored(4))
    assert tiers(idx) == TierOverlap(gpu=4)


def test_write_back_loses_then_stores_in_host_memory():
    """--hicache-write-policy write_back: the GPU removal comes before the host copy's store."""
    idx = index_with(stored(4), removed(2, 4), stored(4, "host", start=2))
    assert tiers(idx) == TierOverlap(gpu=2, host=2)


def test_a_removal_is_never_assumed_and_one_for_an_unknown_tier_changes_nothing():
    idx = index_with(stored(4, "host"), removed(0, 4))  # a GPU removal of host-only blocks
    assert tiers(idx) == TierOverlap(host=4)
    idx = index_with(stored(4), stored(4, "host"))  # evicted from the GPU without an event
    assert tiers(idx) == TierOverlap(gpu=4)


def test_blocks_below_a_host_prefix_extend_it_in_their_own_tier():
    """A storage prefetch lands host blocks; a prompt then computes more on the GPU below them."""
    idx = index_with(stored(3, "disk"), stored(5, "host", start=3), stored(8, start=5))
    assert tiers(idx) == TierOverlap(gpu=3, host=2, disk=3)


def test_a_gpu_prediction_sits_over_a_host_block_until_it_expires():
    idx = index_with(stored(4, "host"))
    idx.predict(("a", 0), PROMPT[:6], expires_at=10.0)
    assert tiers(idx) == TierOverlap(gpu=6)
    assert idx.block_count("a", predicted=True) == 6
    idx.expire(11.0)
    assert tiers(idx) == TierOverlap(host=4)


def test_a_gpu_removal_cancels_a_prediction_but_keeps_the_host_copy():
    idx = index_with(stored(4), stored(4, "host"))
    idx.predict(("a", 0), PROMPT[:4], expires_at=10.0)
    idx.apply(KvEventBatch(instance_id="a", seq=1, events=[removed(0, 4)]))
    assert tiers(idx) == TierOverlap(host=4)


def test_cleared_drops_every_tier():
    idx = index_with(stored(4), stored(4, "host"), removed(2, 4), AllBlocksCleared())
    assert tiers(idx) == TierOverlap() and idx.block_count("a", medium="host") == 0


def test_a_snapshot_gives_a_late_frontend_the_same_tiers():
    events = [stored(6), stored(6, "host"), removed(3, 6), removed(5, 6, "host")]
    live = index_with(*events)
    late = KvIndex()
    late.add_worker("a", PAGE)
    late.begin_sync("a")
    snapshot = [stored(3), stored(5, "host")]  # what the worker's mirror sends: one store per tier held
    late.end_sync("a", [KvSnapshotPart(instance_id="a", next_seq=1, events=snapshot)])
    assert tiers(late) == tiers(live) == TierOverlap(gpu=3, host=2)
