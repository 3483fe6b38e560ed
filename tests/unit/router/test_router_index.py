"""The KV prefix index: stored blocks re-hashed to our chained hashes, removals mapped from engine
hashes, prefix overlap counted up to the first missing block, sequence gaps and departures dropping a
worker's state, and later stored events rebuilding it."""

from __future__ import annotations

from dynamo_worker.protocol import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    KvSnapshotPart,
    hash_token_blocks,
)
from dynamo_worker.router.index import KvIndex

PAGE = 4
TOKENS = list(range(100, 132))  # 8 blocks


def stored(tokens, engine_hashes, parent=None):
    return BlockStored(parent_hash=parent, block_hashes=engine_hashes, token_ids=tokens)


def batch(worker, seq, *events):
    return KvEventBatch(instance_id=worker, seq=seq, events=list(events))


def engine(n, base=10_000):
    """Engine hashes unrelated to ours, as SGLang's are."""
    return [base + i for i in range(n)]


def test_overlap_counts_leading_blocks_held():
    idx = KvIndex()
    idx.add_worker("a", PAGE)
    idx.add_worker("b", PAGE)
    idx.apply(batch("a", 0, stored(TOKENS[:16], engine(4))))
    idx.apply(batch("b", 0, stored(TOKENS[:8], engine(2, 20_000))))
    prompt = hash_token_blocks(TOKENS, PAGE)
    assert idx.overlaps(prompt, [("a", 0), ("b", 0)]) == {("a", 0): 4, ("b", 0): 2}


def test_continuation_uses_parent_engine_hash():
    idx = KvIndex()
    idx.add_worker("a", PAGE)
    first = engine(2)
    idx.apply(batch("a", 0, stored(TOKENS[:8], first)))
    idx.apply(batch("a", 1, stored(TOKENS[8:16], engine(2, 500), parent=first[-1])))
    assert idx.overlaps(hash_token_blocks(TOKENS, PAGE), [("a", 0)]) == {("a", 0): 4}


def test_different_prefix_same_tail_does_not_match():
    idx = KvIndex()
    idx.add_worker("a", PAGE)
    other = [1, 2, 3, 4, *TOKENS[4:16]]
    idx.apply(batch("a", 0, stored(other, engine(4))))
    assert idx.overlaps(hash_token_blocks(TOKENS, PAGE), [("a", 0)]) == {("a", 0): 0}


def test_removal_maps_engine_hashes_and_cuts_prefix():
    idx = KvIndex()
    idx.add_worker("a", PAGE)
    hashes = engine(4)
    idx.apply(batch("a", 0, stored(TOKENS[:16], hashes)))
    idx.apply(batch("a", 1, BlockRemoved(block_hashes=[hashes[1]])))
    assert idx.overlaps(hash_token_blocks(TOKENS, PAGE), [("a", 0)]) == {("a", 0): 1}
    assert idx.block_count("a") == 3


def test_unknown_removals_are_ignored():
    idx = KvIndex()
    idx.add_worker("a", PAGE)
    idx.apply(batch("a", 0, stored(TOKENS[:8], engine(2))))
    result = idx.apply(batch("a", 1, BlockRemoved(block_hashes=[1, 2, 3])))
    assert result is not None and result.removed == 0
    assert idx.block_count("a") == 2


def test_cleared_drops_everything_of_that_worker_only():
    idx = KvIndex()
    idx.add_worker("a", PAGE)
    idx.add_worker("b", PAGE)
    idx.apply(batch("a", 0, stored(TOKENS[:8], engine(2))))
    idx.apply(batch("b", 0, stored(TOKENS[:8], engine(2))))
    idx.apply(batch("a", 1, AllBlocksCleared()))
    assert idx.overlaps(hash_token_blocks(TOKENS, PAGE), [("a", 0), ("b", 0)]) == {("a", 0): 0, ("b", 0): 2}


def test_gap_drops_state_then_stored_events_rebuild():
    idx = KvIndex()
    idx.add_worker("a", PAGE)
    hashes = engine(4)
    idx.apply(batch("a", 0, stored(TOKENS[:16], hashes)))
    # seq 1 is lost; seq 2 continues from a parent we must no longer trust
    result = idx.apply(batch("a", 2, stored(TOKENS[16:20], [999], parent=hashes[-1])))
    assert result is not None and result.gap and result.skipped == 1
    assert idx.block_count("a") == 0
    assert idx.overlaps(hash_token_blocks(TOKENS, PAGE), [("a", 0)]) == {("a", 0): 0}
    # a fresh sequence from the root rebuilds it, in order from seq 3
    result = idx.apply(batch("a", 3, stored(TOKENS[:12], engine(3, 700))))
    assert result is not None and not result.gap
    assert idx.overlaps(hash_token_blocks(TOKENS, PAGE), [("a", 0)]) == {("a", 0): 3}


def test_worker_removed_drops_its_blocks_and_later_events():
    idx = KvIndex()
    idx.add_worker("a", PAGE)
    idx.add_worker("b", PAGE)
    idx.apply(batch("a", 0, stored(TOKENS[:8], engine(2))))
    idx.apply(batch("b", 0, stored(TOKENS[:8], engine(2, 50))))
    idx.remove_worker("a")
    assert idx.apply(batch("a", 1, stored(TOKENS[:16], engine(4)))) is None
    assert idx.overlaps(hash_token_blocks(TOKENS, PAGE), [("a", 0), ("b", 0)]) == {("a", 0): 0, ("b", 0): 2}
    assert "a" not in idx.workers()


def test_same_content_under_two_engine_hashes_survives_one_removal():
    idx = KvIndex()
    idx.add_worker("a", PAGE)
    idx.apply(batch("a", 0, stored(TOKENS[:4], [1])))
    idx.apply(batch("a", 1, stored(TOKENS[:4], [2])))
    idx.apply(batch("a", 2, BlockRemoved(block_hashes=[1])))
    assert idx.overlaps(hash_token_blocks(TOKENS, PAGE), [("a", 0)]) == {("a", 0): 1}
    idx.apply(batch("a", 3, BlockRemoved(block_hashes=[2])))
    assert idx.overlaps(hash_token_blocks(TOKENS, PAGE), [("a", 0)]) == {("a", 0): 0}


def test_partial_trailing_block_is_not_indexed():
    idx = KvIndex()
    idx.add_worker("a", PAGE)
    result = idx.apply(batch("a", 0, stored(TOKENS[:6], engine(1))))
    assert result is not None and result.stored == 1
    assert idx.block_count("a") == 1


def test_snapshot_installs_blocks_and_applies_only_the_batches_it_lacks():
    """A late frontend: batches that arrive while the snapshot is awaited are buffered; those the
    snapshot already includes (seq < next_seq) are dropped, the newer ones applied after it."""
    idx = KvIndex()
    idx.add_worker("a", PAGE)
    idx.begin_sync("a")
    first, second = engine(2), engine(2, 500)
    assert idx.apply(batch("a", 4, stored(TOKENS[:8], first))).buffered  # already in the snapshot
    assert idx.apply(batch("a", 5, stored(TOKENS[8:16], second, parent=first[-1]))).buffered
    assert idx.overlaps(hash_token_blocks(TOKENS, PAGE), [("a", 0)]) == {("a", 0): 0}
    snapshot = [KvSnapshotPart(instance_id="a", next_seq=5, events=[stored(TOKENS[:8], first)])]
    assert idx.end_sync("a", snapshot) == 2
    assert idx.overlaps(hash_token_blocks(TOKENS, PAGE), [("a", 0)]) == {("a", 0): 4}
    # and the sequence goes on from the buffered batch
    assert not idx.apply(batch("a", 6, BlockRemoved(block_hashes=[second[-1]]))).gap
    assert idx.overlaps(hash_token_blocks(TOKENS, PAGE), [("a", 0)]) == {("a", 0): 3}


def test_no_snapshot_falls_back_to_the_buffered_events():
    idx = KvIndex()
    idx.add_worker("a", PAGE)
    idx.begin_sync("a")
    idx.apply(batch("a", 7, stored(TOKENS[:8], engine(2))))
    idx.end_sync("a", None)
    assert idx.overlaps(hash_token_blocks(TOKENS, PAGE), [("a", 0)]) == {("a", 0): 2}


def test_a_restarted_worker_numbering_from_zero_loses_its_blocks():
    idx = KvIndex()
    idx.add_worker("a", PAGE)
    idx.apply(batch("a", 0, stored(TOKENS[:8], engine(2))))
    idx.apply(batch("a", 1, stored(TOKENS[8:16], engine(2, 500), parent=10_001)))
    result = idx.apply(batch("a", 0, stored(TOKENS[:4], engine(1, 900))))
    assert result.gap
    assert idx.block_count("a") == 1


def test_dp_ranks_hold_blocks_separately():
    idx = KvIndex()
    idx.add_worker("a", PAGE, dp_size=2)
    idx.apply(KvEventBatch(instance_id="a", seq=0, dp_rank=1, events=[stored(TOKENS[:8], engine(2))]))
    prompt = hash_token_blocks(TOKENS, PAGE)
    assert idx.overlaps(prompt, [("a", 0), ("a", 1)]) == {("a", 0): 0, ("a", 1): 2}
    # removals name engine hashes of their own rank only
    idx.apply(KvEventBatch(instance_id="a", seq=1, dp_rank=0, events=[BlockRemoved(block_hashes=engine(2))]))
    assert idx.block_count("a", 1) == 2
