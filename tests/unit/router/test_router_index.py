"""The KV prefix index: stored blocks re-hashed to our chained hashes, removals mapped from engine
hashes, prefix overlap counted up to the first missing block, sequence gaps and departures dropping a
worker's state, and later stored events rebuilding it."""

from __future__ import annotations

from dynamo_worker.protocol import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
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
