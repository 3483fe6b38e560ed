"""Routing on KV tiers: a leading block counts by what it saves (GPU 1, host memory
``host_hit_weight``, storage ``disk_hit_weight``), weights 0 give GPU-only routing, the Router reads the
tiers from the index, and a block held only in host memory takes no room in the GPU cache."""

from __future__ import annotations

import random

import pytest
from dynamo_worker.protocol import BlockRemoved, BlockStored, InstanceRecord, KvEventBatch
from dynamo_worker.router.policy import KvCandidate, KvWeights, kv_choose, kv_cost, saved_blocks
from dynamo_worker.router.router import Router

PAGE = 4
W = KvWeights()
GPU_ONLY = KvWeights(host_hit_weight=0.0, disk_hit_weight=0.0)


def test_defaults_are_the_measured_host_weight_and_nvidia_dynamo_s_disk_weight():
    assert (W.host_hit_weight, W.disk_hit_weight) == (0.9, 0.25)


def test_each_leading_block_saves_by_its_tier():
    c = KvCandidate("a", overlap_blocks=2, host_blocks=4, disk_blocks=2)
    assert saved_blocks(c, W) == pytest.approx(2 + 0.9 * 4 + 0.25 * 2)
    assert kv_cost(c, prompt_blocks=10, weights=W) == pytest.approx(W.overlap_weight * (10 - 6.1 + 1))
    assert saved_blocks(c, GPU_ONLY) == 2


def test_gpu_hit_beats_host_hit_beats_miss():
    gpu = KvCandidate("gpu", overlap_blocks=8)
    host = KvCandidate("host", host_blocks=8)
    miss = KvCandidate("miss")
    assert kv_choose([gpu, host, miss], 8, W, random.Random(0))[0].worker_id == "gpu"
    assert kv_choose([host, miss], 8, W, random.Random(0))[0].worker_id == "host"


def test_weight_zero_sees_a_host_hit_as_a_miss():
    host = KvCandidate("host", host_blocks=8)
    miss = KvCandidate("miss")
    _, costs = kv_choose([host, miss], 8, GPU_ONLY, random.Random(0))
    assert costs["host"] == costs["miss"]


def record(worker_id: str, total_kv_blocks: int = 1000) -> InstanceRecord:
    return InstanceRecord(
        instance_id=worker_id,
        namespace="ns",
        component="backend",
        role="agg",
        model="m",
        address="127.0.0.1:1",
        page_size=PAGE,
        total_kv_blocks=total_kv_blocks,
    )


A, B = "a" * 16, "b" * 16
TOKENS = list(range(100, 164))  # 16 blocks
ENGINE = list(range(500, 516))


def demoted(worker: str) -> list[KvEventBatch]:
    """The prompt stored on the GPU, backed up in host memory, then evicted from the GPU."""
    return [
        KvEventBatch(
            instance_id=worker,
            seq=0,
            events=[
                BlockStored(parent_hash=None, block_hashes=ENGINE, token_ids=TOKENS),
                BlockStored(parent_hash=None, block_hashes=ENGINE, token_ids=TOKENS, medium="host"),
                BlockRemoved(block_hashes=ENGINE),
            ],
        )
    ]


def routed(weights: KvWeights, seed: int) -> str:
    router = Router("kv", weights=weights, rng=random.Random(seed))
    workers = [record(A), record(B)]
    for w in workers:
        router.add_worker(w)
    for batch in demoted(A):
        router.on_kv_events(batch)
    choice = router.choose("m", workers, [*TOKENS, 1])
    return f"{choice.worker.instance_id[0]}:{choice.overlap_blocks}"


def test_the_router_sends_a_returning_prompt_to_its_host_copy():
    assert {routed(W, seed) for seed in range(20)} == {"a:16"}


def test_gpu_only_routing_does_not_see_the_host_copy():
    assert {routed(GPU_ONLY, seed) for seed in range(20)} == {"a:16", "b:0"}  # a tie, broken at random


def test_blocks_held_only_in_host_memory_take_no_gpu_room():
    """The balance guard moves load off a busy holder onto an idle worker only when that one's GPU cache
    has room. Worker b's 20-block cache once held 16 blocks, all demoted to host memory since: it has
    room, so the guard moves the request there (were host blocks counted, b would look full and the
    request would stay on a)."""
    router = Router("kv", weights=W, rng=random.Random(0))
    holder, other = record(A, total_kv_blocks=20), record(B, total_kv_blocks=20)
    for w in (holder, other):
        router.add_worker(w)
    for batch in demoted(B):
        router.on_kv_events(batch)
    assert router.index.block_count(B) == 0 and router.index.block_count(B, medium="host") == 16
    prompt = list(range(900, 908))  # 2 blocks, held by neither
    flights = [router.started(router.choose("m", [holder], [*prompt, i])) for i in range(4)]
    for f in flights:
        f.first_token()  # 4 requests decoding on a, which holds the prompt (predicted)
    choice = router.choose("m", [holder, other], [*prompt, 99])
    assert choice.worker.instance_id == B
    for f in flights:
        f.done()
