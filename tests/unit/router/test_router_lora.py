"""Routing LoRA adapter requests: an adapter's blocks are keyed on tokens and the adapter's name (the
same prefix hashes alike on every worker and after a reload, and never as the base model's or another
adapter's), overlap counts only the adapter's blocks, residency in the GPU slots is worth
``lora_swap_blocks``, full batch slots ``lora_wait_blocks``, and the balance guard spreads an adapter
to a worker without it only past its threshold and only where a slot is free."""

from __future__ import annotations

import random

from dynamo_worker.protocol import (
    BlockStored,
    InstanceRecord,
    KvEventBatch,
    LoraAdapter,
    LoraState,
    hash_token_blocks,
    lora_seed,
)
from dynamo_worker.router.index import KvIndex
from dynamo_worker.router.policy import KvCandidate, KvWeights, kv_choose, kv_cost
from dynamo_worker.router.router import Router

PAGE = 4
W = KvWeights()
PROMPT = list(range(100, 132))  # 8 blocks
W1, W2 = "1" * 16, "2" * 16


def record(worker_id: str, adapters: tuple[str, ...] = (), slots: int = 4, pinned: tuple[str, ...] = ()):
    return InstanceRecord(
        instance_id=worker_id,
        namespace="ns",
        component="backend",
        role="agg",
        model="m",
        address="127.0.0.1:1",
        page_size=PAGE,
        total_kv_blocks=1000,
        lora=LoraState(
            adapters=[LoraAdapter(name=a, uri=f"file:///{a}", pinned=a in pinned) for a in adapters],
            max_loras_per_batch=slots,
        ),
    )


def stored(worker_id: str, seq: int, tokens: list[int], lora: str | None, first_hash: int) -> KvEventBatch:
    n = len(tokens) // PAGE
    return KvEventBatch(
        instance_id=worker_id,
        seq=seq,
        events=[
            BlockStored(
                parent_hash=None,
                block_hashes=list(range(first_hash, first_hash + n)),
                token_ids=tokens,
                lora_name=lora,
            )
        ],
    )


def test_an_adapters_blocks_chain_from_its_name_and_differ_from_the_base_and_other_adapters():
    base, a1, a2 = (hash_token_blocks(PROMPT, PAGE, lora_name=n) for n in (None, "a1", "a2"))
    assert len({base[0], a1[0], a2[0]}) == 3
    assert a1 == hash_token_blocks(PROMPT, PAGE, lora_seed("a1"))  # the seed is the first block's parent
    assert a1[4:] == hash_token_blocks(PROMPT[16:], PAGE, a1[3], lora_name="a2")  # then tokens only


def test_the_index_keys_adapter_blocks_on_tokens_and_name_not_on_engine_hashes():
    index = KvIndex()
    for w in ("w1", "w2"):
        index.add_worker(w, PAGE)
    # two workers, different engine hashes (SGLang's per-load ids), the same adapter prefix
    index.apply(stored("w1", 0, PROMPT, "a1", first_hash=1000))
    index.apply(stored("w2", 0, PROMPT, "a1", first_hash=5000))
    ours = hash_token_blocks(PROMPT, PAGE, lora_name="a1")
    assert index.overlaps(ours, ["w1", "w2"]) == {"w1": 8, "w2": 8}
    assert index.overlaps(hash_token_blocks(PROMPT, PAGE), ["w1", "w2"]) == {"w1": 0, "w2": 0}
    assert index.overlaps(hash_token_blocks(PROMPT, PAGE, lora_name="a2"), ["w1"]) == {"w1": 0}


def test_residency_and_full_slots_cost_what_their_weights_say():
    resident = KvCandidate("w1")
    swap = KvCandidate("w2", lora_resident=False)
    full = KvCandidate("w3", lora_resident=False, lora_slots_full=True)
    assert kv_cost(swap, 8, W) - kv_cost(resident, 8, W) == W.lora_swap_blocks
    assert kv_cost(full, 8, W) - kv_cost(swap, 8, W) == W.lora_wait_blocks


def test_a_resident_adapter_keeps_its_worker_until_its_queue_outweighs_the_swap():
    rng = random.Random(0)
    resident = KvCandidate("w1", prefill_blocks=3)
    other = KvCandidate("w2", lora_resident=False)
    assert kv_choose([resident, other], 8, W, rng)[0].worker_id == "w1"
    busier = KvCandidate("w1", prefill_blocks=int(W.lora_swap_blocks) + 1)
    assert kv_choose([busier, other], 8, W, rng)[0].worker_id == "w2"


def test_the_balance_guard_spreads_an_adapter_only_to_a_worker_with_a_free_slot():
    rng = random.Random(0)
    w = KvWeights(lora_swap_blocks=100.0)  # residency alone would keep the adapter on w1
    hot = KvCandidate("w1", requests=9, free_blocks=900, capacity_blocks=1000)
    idle_full = KvCandidate(
        "w2", requests=0, lora_resident=False, lora_slots_full=True, free_blocks=900, capacity_blocks=1000
    )
    idle_free = KvCandidate("w3", requests=0, lora_resident=False, free_blocks=900, capacity_blocks=1000)
    assert kv_choose([hot, idle_full, idle_free], 8, w, rng)[0].worker_id == "w3"
    assert kv_choose([KvCandidate("w1", requests=2), idle_free], 8, w, rng)[0].worker_id == "w1"  # below


def test_the_router_remembers_what_each_worker_runs_as_its_slots_do():
    router = Router("kv", rng=random.Random(0))
    w1, w2 = record(W1, ("a1", "a2", "a3"), slots=2), record(W2, ("a1", "a2", "a3"), slots=2, pinned=("a3",))
    for r in (w1, w2):
        router.add_worker(r)
    assert router.lora_residency(W1, w1, "a1") == (False, False)  # never ran it
    assert router.lora_residency(W2, w2, "a3") == (True, False)  # pinned: always in a slot
    first = router.choose("m", [w1], PROMPT, "a1")
    assert first.lora_name == "a1"
    flight = router.started(first)
    assert router.lora_residency(W1, w1, "a1") == (True, False)
    other = router.started(router.choose("m", [w1], PROMPT, "a2"))
    # both slots run an adapter (a1, a2): the base model and a3 would wait for one
    assert router.lora_residency(W1, w1, None) == (True, True)
    assert router.lora_residency(W1, w1, "a3") == (False, True)
    flight.done()
    other.done()
    assert router.lora_residency(W1, w1, "a3") == (False, False)
    router.started(router.choose("m", [w1], PROMPT, "a3")).done()  # a3 in: a1 leaves the slots
    assert router.lora_residency(W1, w1, "a1") == (False, False)
    assert router.lora_residency(W1, w1, "a2") == (True, False)


def test_adapter_requests_follow_the_adapters_cached_prefix_not_the_base_models():
    router = Router("kv", rng=random.Random(0))
    w1, w2 = record(W1, ("a1",)), record(W2, ("a1",))
    for r in (w1, w2):
        router.add_worker(r)
    router.on_kv_events(stored(W1, 0, PROMPT, None, first_hash=10))  # the base prefix on w1
    router.on_kv_events(stored(W2, 0, PROMPT, "a1", first_hash=20))  # a1's on w2
    assert router.choose("m", [w1, w2], [*PROMPT, 1, 2], "a1").worker.instance_id == W2
    assert router.choose("m", [w1, w2], [*PROMPT, 1, 2]).worker.instance_id == W1
