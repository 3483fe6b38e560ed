"""The mocker's simulated HiCache host tier (write_through, as SGLang's default): every GPU block copied
to host memory (GPU store, then host store), a GPU eviction demoting a copied block (GPU removal, the
host copy stays), host hits loaded back (GPU store) and counted apart from GPU hits, host memory
evicting only blocks no longer on the GPU (host removal), and no copy when host memory holds only
copies of GPU blocks."""

from __future__ import annotations

from dynamo_worker.mocker.kv_manager import BlockManager
from dynamo_worker.protocol import BlockRemoved, BlockStored, KvEventBatch, hash_token_blocks
from dynamo_worker.router.index import KvIndex, TierOverlap
from hypothesis import given, settings
from hypothesis import strategies as st

PAGE = 4
A = list(range(100, 108))  # two blocks
B = list(range(200, 208))
C = list(range(300, 308))


def run(kv: BlockManager, seq_id: str, tokens: list[int]):
    alloc = kv.allocate(seq_id, tokens)
    assert alloc is not None
    kv.free(seq_id)
    return alloc


def test_write_through_copies_every_new_block_to_host_memory():
    kv = BlockManager(total_blocks=4, page_size=PAGE, host_blocks=8)
    alloc = run(kv, "a", A)
    hashes = hash_token_blocks(A, PAGE)
    assert alloc.events == [
        BlockStored(parent_hash=None, block_hashes=hashes, token_ids=A),
        BlockStored(parent_hash=None, block_hashes=hashes, token_ids=A, medium="host"),
    ]
    assert kv.host_held_blocks == 2


def test_gpu_eviction_demotes_and_a_returning_prompt_is_a_host_hit():
    kv = BlockManager(total_blocks=4, page_size=PAGE, host_blocks=8)
    run(kv, "a", A)
    run(kv, "b", B)
    evicting = run(kv, "c", C)  # the GPU holds 4 blocks: A's two go
    assert BlockRemoved(block_hashes=hash_token_blocks(A, PAGE)[::-1]) in evicting.events
    assert not [e for e in evicting.events if isinstance(e, BlockRemoved) and e.medium == "host"]
    back = run(kv, "a2", [*A, 1])
    assert (back.cached_tokens, back.host_cached_tokens) == (8, 8)
    loaded = [e for e in back.events if isinstance(e, BlockStored)]
    assert loaded == [BlockStored(parent_hash=None, block_hashes=hash_token_blocks(A, PAGE), token_ids=A)]
    again = run(kv, "a3", [*A, 1])  # now on the GPU again
    assert (again.cached_tokens, again.host_cached_tokens) == (8, 0)


def test_host_memory_evicts_only_blocks_no_longer_on_the_gpu():
    kv = BlockManager(total_blocks=4, page_size=PAGE, host_blocks=6)
    run(kv, "a", A)
    run(kv, "b", B)
    run(kv, "c", C)  # GPU: B, C; host: A, B, C (6 blocks, full)
    d = list(range(400, 408))
    alloc = run(
        kv, "d", d
    )  # GPU evicts B (demoted); host makes room for D by dropping A, the oldest host-only
    host_removed = [e for e in alloc.events if isinstance(e, BlockRemoved) and e.medium == "host"]
    assert host_removed == [BlockRemoved(block_hashes=hash_token_blocks(A, PAGE)[::-1], medium="host")]
    assert kv.cached_prefix_tokens([*A, 1]) == 0
    assert kv.cached_prefix_tokens([*B, 1]) == 8  # in host memory


def test_no_copy_when_host_memory_holds_only_gpu_blocks():
    kv = BlockManager(total_blocks=8, page_size=PAGE, host_blocks=2)
    run(kv, "a", A)
    alloc = run(kv, "b", B)  # host memory is full of A's copies, and A is still on the GPU
    assert [e.medium for e in alloc.events] == ["gpu"]


def test_without_a_host_tier_nothing_changes():
    kv = BlockManager(total_blocks=4, page_size=PAGE)
    run(kv, "a", A)
    run(kv, "b", B)
    alloc = run(kv, "c", C)
    assert {e.medium for e in alloc.events} == {"gpu"}
    assert kv.cached_prefix_tokens([*A, 1]) == 0 and kv.host_held_blocks == 0


@settings(max_examples=60)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=40), st.integers(2, 10))
def test_the_events_build_the_manager_s_own_view_in_an_index(prompts, host_blocks):
    """Fed the events, a router's index sees every block where the manager holds it: GPU hits, then
    host hits, for every prompt."""
    kv = BlockManager(total_blocks=6, page_size=PAGE, host_blocks=host_blocks)
    index = KvIndex()
    index.add_worker("w", PAGE)
    shapes = {i: [i * 1000 + j for j in range(4 * (i % 3 + 1))] for i in range(6)}
    seq = 0
    for n, p in enumerate(prompts):
        alloc = kv.allocate(f"r{n}", [*shapes[p], 7])
        if alloc is None:
            continue
        index.apply(KvEventBatch(instance_id="w", seq=seq, events=alloc.events))
        seq += 1
        kv.free(f"r{n}")
        for q in shapes.values():
            hashes = hash_token_blocks(q, PAGE)
            gpu, host = kv.prefix_hits(hashes)
            assert index.tier_overlaps(hashes, ["w"])["w"] == TierOverlap(gpu=gpu, host=host)
