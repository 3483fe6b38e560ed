"""The mocker's KV block manager: prefix reuse, reference counting, LRU eviction (leaves first), the
KV events it emits, and its capacity invariants under random workloads."""

from __future__ import annotations

from dynamo_worker.mocker.kv_manager import BlockManager
from dynamo_worker.protocol import AllBlocksCleared, BlockRemoved, BlockStored, hash_token_blocks
from hypothesis import given, settings
from hypothesis import strategies as st

PAGE = 4


def test_allocation_stores_full_blocks_with_their_tokens():
    kv = BlockManager(total_blocks=10, page_size=PAGE)
    tokens = list(range(10))
    alloc = kv.allocate("a", tokens)
    assert alloc is not None and alloc.cached_tokens == 0
    hashes = hash_token_blocks(tokens, PAGE)
    assert alloc.events == [BlockStored(parent_hash=None, block_hashes=hashes, token_ids=tokens[:8])]
    assert kv.active_blocks == 3  # two full + one partial


def test_shared_prefix_is_reused_and_counted_as_cached():
    kv = BlockManager(total_blocks=10, page_size=PAGE)
    kv.allocate("a", [*list(range(8)), 100, 101])
    alloc = kv.allocate("b", [*list(range(8)), 200, 201, 202, 203, 9])
    assert alloc is not None and alloc.cached_tokens == 8
    new_hash = hash_token_blocks([*list(range(8)), 200, 201, 202, 203], PAGE)[2]
    parent = hash_token_blocks(list(range(8)), PAGE)[1]
    assert alloc.events == [
        BlockStored(parent_hash=parent, block_hashes=[new_hash], token_ids=[200, 201, 202, 203])
    ]
    assert kv.active_blocks == 2 + 1 + 1 + 1  # 2 shared, a partial, b: 1 new full + 1 partial


def test_a_fully_cached_prompt_still_computes_its_last_token():
    kv = BlockManager(total_blocks=10, page_size=PAGE)
    kv.allocate("a", list(range(8)))
    kv.free("a")
    alloc = kv.allocate("b", list(range(8)))
    assert alloc is not None and alloc.cached_tokens == 7 and alloc.events == []


def test_freed_blocks_stay_cached_until_evicted_least_recent_leaf_first():
    kv = BlockManager(total_blocks=4, page_size=PAGE)
    a = list(range(8))
    kv.allocate("a", a)
    kv.free("a")
    assert kv.active_blocks == 0 and kv.cached_blocks == 2 and kv.free_blocks == 4
    b = list(range(100, 112))  # three blocks: needs one eviction
    alloc = kv.allocate("b", b)
    assert alloc is not None
    leaf = hash_token_blocks(a, PAGE)[1]
    assert alloc.events[0] == BlockRemoved(block_hashes=[leaf])  # the leaf goes first
    assert isinstance(alloc.events[1], BlockStored)
    assert kv.cached_prefix_tokens([*a, 0]) == PAGE  # the root block survived


def test_allocation_fails_cleanly_when_full():
    kv = BlockManager(total_blocks=3, page_size=PAGE)
    assert kv.allocate("a", list(range(8))) is not None
    assert kv.allocate("b", list(range(50, 58))) is None
    assert kv.active_blocks == 2 and not kv.has_seq("b")


def test_append_fills_a_block_and_emits_it_with_its_parent():
    kv = BlockManager(total_blocks=5, page_size=PAGE)
    kv.allocate("a", [1, 2, 3, 4, 5, 6])
    assert kv.append("a", 7) == []
    events = kv.append("a", 8)
    parent, child = hash_token_blocks([1, 2, 3, 4, 5, 6, 7, 8], PAGE)
    assert events == [BlockStored(parent_hash=parent, block_hashes=[child], token_ids=[5, 6, 7, 8])]
    assert kv.active_blocks == 2
    assert kv.append("a", 9) == [] and kv.active_blocks == 3  # a new partial block


def test_append_without_room_returns_none_and_changes_nothing():
    kv = BlockManager(total_blocks=2, page_size=PAGE)
    kv.allocate("a", list(range(8)))
    assert kv.append("a", 9) is None
    assert kv.seq_tokens("a") == 8 and kv.active_blocks == 2


def test_clear_drops_cached_blocks():
    kv = BlockManager(total_blocks=4, page_size=PAGE)
    kv.allocate("a", list(range(8)))
    kv.free("a")
    assert kv.clear() == [AllBlocksCleared()]
    assert kv.cached_blocks == 0 and kv.cached_prefix_tokens(list(range(9))) == 0


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["alloc", "append", "free"]),
            st.integers(0, 5),
            st.lists(st.integers(0, 3), min_size=1, max_size=14),
        ),
        max_size=60,
    ),
    total=st.integers(1, 12),
)
def test_invariants_hold_and_events_replay_to_the_cached_set(ops, total):
    """Replaying the emitted events gives exactly the set of cached hashes; capacity is never exceeded."""
    kv = BlockManager(total_blocks=total, page_size=2)
    known: set[int] = set()
    for op, seq, tokens in ops:
        key = f"s{seq}"
        events = []
        if op == "alloc" and not kv.has_seq(key):
            alloc = kv.allocate(key, tokens)
            events = alloc.events if alloc else []
        elif op == "append" and kv.has_seq(key):
            events = kv.append(key, tokens[0]) or []
        elif op == "free":
            kv.free(key)
        for e in events:
            if isinstance(e, BlockStored):
                assert not set(e.block_hashes) & known
                assert len(e.token_ids) == 2 * len(e.block_hashes)
                known |= set(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                assert set(e.block_hashes) <= known
                known -= set(e.block_hashes)
        assert 0 <= kv.active_blocks <= total
        assert kv.cached_blocks + kv._partials <= total
        assert known == set(kv._refs)
