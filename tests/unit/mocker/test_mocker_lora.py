"""The mocker's LoRA adapters, as SGLang keeps them: a batch of at most ``max_loras_per_batch`` distinct
adapters with the base model counting as one and pinned adapters keeping their slots; held adapters
evicted least recently used past ``max_loaded_loras``; the GPU pool's swaps; and a prefix-cache
namespace per adapter whose KV events name it."""

from __future__ import annotations

import pytest
from dynamo_worker.mocker.kv_manager import BlockManager
from dynamo_worker.mocker.lora import MockLoras
from dynamo_worker.protocol import BlockStored, hash_token_blocks
from dynamo_worker.runtime.lora_checks import LoraError

PAGE = 4
PROMPT = list(range(10, 30))  # 5 blocks


def test_a_batch_holds_as_many_distinct_adapters_as_slots_the_base_model_included():
    loras = MockLoras(max_loras_per_batch=2)
    for name in ("a1", "a2"):
        loras.load(name, pinned=False)
    assert loras.can_join({None}, "a1")
    assert not loras.can_join({None, "a1"}, "a2")  # the base model took one of the two slots
    assert loras.can_join({None, "a1"}, "a1") and loras.can_join({"a1", "a2"}, "a2")
    assert not loras.can_join({"a1", "a2"}, None)


def test_pinned_adapters_keep_their_slots():
    loras = MockLoras(max_loras_per_batch=3)
    loras.load("p", pinned=True)
    for name in ("a1", "a2"):
        loras.load(name, pinned=False)
    assert loras.can_join({None}, "a1")
    assert not loras.can_join({None, "a1"}, "a2")  # p keeps its slot even when it does not run
    assert loras.can_join({"p", "a1"}, None)


def test_past_max_loaded_loras_the_least_recently_used_unpinned_adapter_goes():
    loras = MockLoras(max_loras_per_batch=2, max_loaded_loras=2)
    loras.load("a1", pinned=False)
    loras.load("a2", pinned=False)
    loras.use("a1")
    assert loras.load("a3", pinned=False) == ["a1", "a3"]
    pinned = MockLoras(max_loras_per_batch=2, max_loaded_loras=1)
    pinned.load("p", pinned=True)
    with pytest.raises(LoraError) as e:
        pinned.load("a1", pinned=False)
    assert e.value.reason == "NoFreeSlot" and list(pinned.held) == ["p"]


@pytest.mark.parametrize(("policy", "evicted"), [("lru", "a2"), ("fifo", "a1")])
def test_the_gpu_pool_copies_adapters_in_and_evicts_by_policy(policy, evicted):
    loras = MockLoras(max_loras_per_batch=2, eviction_policy=policy)
    for name in ("a1", "a2", "a3"):
        loras.load(name, pinned=False)
    assert loras.bring_in({"a1"}) == 1 and loras.bring_in({"a2"}) == 1
    assert loras.bring_in({"a1"}) == 0  # resident: no copy (lru: a1 is now the most recent)
    assert loras.bring_in({"a3"}) == 1
    assert evicted not in loras.resident() and "a3" in loras.resident()
    assert loras.swaps == 3


def test_an_adapters_blocks_live_in_a_namespace_of_their_own():
    kv = BlockManager(total_blocks=64, page_size=PAGE)
    base = kv.allocate("base", PROMPT)
    tuned = kv.allocate("tuned", PROMPT, "a1")
    assert base is not None and tuned is not None
    assert tuned.cached_tokens == 0  # the base model's blocks are not the adapter's
    stored = [e for e in tuned.events if isinstance(e, BlockStored)]
    assert [e.lora_name for e in stored] == ["a1"]
    assert stored[0].block_hashes == hash_token_blocks(PROMPT, PAGE, lora_name="a1")
    assert kv.cached_prefix_tokens(PROMPT, "a1") == len(PROMPT) - 1  # all but the recomputed last
    assert kv.cached_prefix_tokens(PROMPT, "a2") == 0
    kv.free("tuned")
    again = kv.allocate("again", PROMPT, "a1")
    assert again is not None and again.cached_tokens > 0 and not again.events


def test_generated_tokens_extend_the_adapters_namespace():
    kv = BlockManager(total_blocks=64, page_size=PAGE)
    assert kv.allocate("s", [1, 2, 3], "a1") is not None  # a partial first block
    events = kv.append("s", 4)
    assert events == [
        BlockStored(
            parent_hash=None,
            block_hashes=hash_token_blocks([1, 2, 3, 4], PAGE, lora_name="a1"),
            token_ids=[1, 2, 3, 4],
            lora_name="a1",
        )
    ]
