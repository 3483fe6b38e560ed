"""Routing decisions: the kv cost formula, random tie-breaking, round-robin order, and the Router
combining the index, load metrics and in-flight work."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from dynamo_worker.protocol import BlockStored, InstanceRecord, KvEventBatch, LoadMetrics
from dynamo_worker.router.policy import KvCandidate, RoundRobin, choose_random, kv_choose, kv_cost
from dynamo_worker.router.router import Router

PAGE = 4


def record(worker_id: str) -> InstanceRecord:
    return InstanceRecord(
        instance_id=worker_id,
        namespace="ns",
        component="backend",
        role="agg",
        model="m",
        address="127.0.0.1:1",
        page_size=PAGE,
        total_kv_blocks=1000,
    )


def test_cost_is_weighted_uncached_plus_load():
    c = KvCandidate("a", overlap_blocks=6, inflight_blocks=3, other_blocks=2, waiting=1)
    assert kv_cost(c, prompt_blocks=10, overlap_weight=2.0) == 2.0 * 4 + 3 + 2 + 1


def test_cost_never_counts_negative_uncached_blocks():
    c = KvCandidate("a", overlap_blocks=12)
    assert kv_cost(c, prompt_blocks=10, overlap_weight=1.0) == 0


def test_weight_zero_routes_on_load_only():
    cached_busy = KvCandidate("a", overlap_blocks=10, other_blocks=5)
    idle = KvCandidate("b", other_blocks=1)
    best, _ = kv_choose([cached_busy, idle], 10, 0.0, random.Random(0))
    assert best.worker_id == "b"


def test_overlap_beats_small_load_difference():
    cached = KvCandidate("a", overlap_blocks=10, inflight_blocks=5)
    idle = KvCandidate("b")
    best, costs = kv_choose([cached, idle], 10, 1.0, random.Random(0))
    assert best.worker_id == "a" and costs == {"a": 5.0, "b": 10.0}


def test_ties_are_broken_at_random():
    candidates = [KvCandidate(w) for w in "abc"]
    rng = random.Random(1)
    picks = Counter(kv_choose(candidates, 5, 1.0, rng)[0].worker_id for _ in range(300))
    assert set(picks) == {"a", "b", "c"}
    assert min(picks.values()) > 50


def test_ties_only_among_the_cheapest():
    candidates = [KvCandidate("a"), KvCandidate("b"), KvCandidate("c", waiting=1)]
    rng = random.Random(2)
    picks = {kv_choose(candidates, 5, 1.0, rng)[0].worker_id for _ in range(100)}
    assert picks == {"a", "b"}


def test_empty_candidates_raise():
    with pytest.raises(ValueError):
        kv_choose([], 1, 1.0, random.Random())
    with pytest.raises(ValueError):
        RoundRobin().choose("k", [])
    with pytest.raises(ValueError):
        choose_random([], random.Random())


def test_round_robin_cycles_in_stable_order_per_key():
    rr = RoundRobin()
    assert [rr.choose("m", ["b", "a", "c"]) for _ in range(4)] == ["a", "b", "c", "a"]
    assert rr.choose("other", ["b", "a"]) == "a"


def test_router_kv_prefers_worker_holding_prefix():
    router = Router("kv", rng=random.Random(0))
    workers = [record("a" * 16), record("b" * 16)]
    for w in workers:
        router.add_worker(w)
    prompt = list(range(40))
    router.on_kv_events(
        KvEventBatch(
            instance_id="b" * 16,
            seq=0,
            events=[BlockStored(parent_hash=None, block_hashes=list(range(8)), token_ids=prompt[:32])],
        )
    )
    choice = router.choose("m/agg", workers, prompt)
    assert choice.worker.instance_id == "b" * 16
    assert (choice.prompt_blocks, choice.overlap_blocks) == (10, 8)


def test_router_kv_load_and_inflight_spread_identical_workers():
    router = Router("kv", rng=random.Random(0))
    workers = [record("a" * 16), record("b" * 16)]
    for w in workers:
        router.add_worker(w)
    first = router.choose("m", workers, list(range(8)))
    router.started(first.worker.instance_id, first.prompt_blocks)
    second = router.choose("m", workers, list(range(100, 108)))
    assert second.worker.instance_id != first.worker.instance_id
    router.finished(first.worker.instance_id, first.prompt_blocks)
    router.on_load(
        LoadMetrics(instance_id="a" * 16, active_blocks=50, total_blocks=100, waiting=0, running=3)
    )
    assert router.choose("m", workers, list(range(8))).worker.instance_id == "b" * 16


def test_router_removed_worker_forgets_load():
    router = Router("kv", rng=random.Random(0))
    a, b = record("a" * 16), record("b" * 16)
    router.add_worker(a)
    router.add_worker(b)
    router.on_load(
        LoadMetrics(instance_id=a.instance_id, active_blocks=50, total_blocks=100, waiting=0, running=3)
    )
    router.remove_worker(a.instance_id)
    router.add_worker(a)
    picks = {router.choose("m", [a, b], [1, 2, 3, 4]).worker.instance_id for _ in range(40)}
    assert picks == {a.instance_id, b.instance_id}


def test_router_round_robin_and_random_modes():
    workers = [record("a" * 16), record("b" * 16)]
    rr = Router("round-robin")
    assert [rr.choose("k", workers, [1]).worker.instance_id[0] for _ in range(3)] == ["a", "b", "a"]
    rnd = Router("random", rng=random.Random(3))
    assert {rnd.choose("k", workers, [1]).worker.instance_id for _ in range(40)} == {
        w.instance_id for w in workers
    }


def test_load_report_sent_before_a_finish_does_not_count_our_finished_request():
    router = Router("kv", rng=random.Random(0))
    a, b = record("a" * 16), record("b" * 16)
    router.add_worker(a)
    router.add_worker(b)
    prompt = list(range(40))
    router.on_kv_events(
        KvEventBatch(
            instance_id=a.instance_id,
            seq=0,
            events=[BlockStored(parent_hash=None, block_hashes=list(range(10)), token_ids=prompt)],
        )
    )
    router.started(a.instance_id, 10)
    router.finished(a.instance_id, 10)
    # a report sent while our request ran arrives after it finished: it counts our 10 blocks (+1 decoded)
    router.on_load(
        LoadMetrics(instance_id=a.instance_id, active_blocks=11, total_blocks=100, waiting=0, running=1)
    )
    assert router.choose("m", [a, b], prompt).worker.instance_id == a.instance_id


def test_load_of_other_frontends_counts():
    router = Router("kv", rng=random.Random(0))
    a, b = record("a" * 16), record("b" * 16)
    router.add_worker(a)
    router.add_worker(b)
    router.on_load(
        LoadMetrics(instance_id=a.instance_id, active_blocks=30, total_blocks=100, waiting=2, running=3)
    )
    candidates = [router.choose("m", [a, b], list(range(8))).worker.instance_id for _ in range(10)]
    assert set(candidates) == {b.instance_id}
