"""Routing decisions: the kv cost formula and its balance guard, random tie-breaking, round-robin
order, and the Router combining the index (stored and predicted blocks), load metrics, in-flight work
and data-parallel ranks."""

from __future__ import annotations

import logging
import random
from collections import Counter
from dataclasses import replace

import pytest
from dynamo_worker.protocol import BlockRemoved, BlockStored, InstanceRecord, KvEventBatch, LoadMetrics
from dynamo_worker.router.policy import (
    KvCandidate,
    KvWeights,
    balance_margin,
    kv_choose,
    kv_cost,
)
from dynamo_worker.router.router import RoundRobin, Router, choose_random

PAGE = 4
W = KvWeights()


def record(worker_id: str, dp_size: int = 1, total_kv_blocks: int = 1000) -> InstanceRecord:
    return InstanceRecord(
        instance_id=worker_id,
        namespace="ns",
        component="backend",
        role="agg",
        model="m",
        address="127.0.0.1:1",
        page_size=PAGE,
        total_kv_blocks=total_kv_blocks,
        dp_size=dp_size,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stored(
    worker_id: str, seq: int, tokens: list[int], dp_rank: int = 0, first_hash: int = 0
) -> KvEventBatch:
    n = len(tokens) // PAGE
    return KvEventBatch(
        instance_id=worker_id,
        seq=seq,
        dp_rank=dp_rank,
        events=[
            BlockStored(
                parent_hash=None,
                block_hashes=list(range(first_hash, first_hash + n)),
                token_ids=tokens[: n * PAGE],
            )
        ],
    )


def test_cost_is_weighted_new_blocks_plus_queued_prefill_plus_weighted_decode():
    c = KvCandidate("a", overlap_blocks=6, prefill_blocks=3, decode_blocks=20)
    weights = KvWeights(overlap_weight=2.0, decode_weight=0.5)
    assert kv_cost(c, prompt_blocks=10, weights=weights) == 2.0 * (4 + 1) + 3 + 0.5 * 20


def test_cost_never_counts_negative_new_blocks_and_always_counts_the_tail():
    c = KvCandidate("a", overlap_blocks=12)
    assert kv_cost(c, prompt_blocks=10, weights=W) == W.overlap_weight * 1


def test_weight_zero_routes_on_load_only():
    cached_busy = KvCandidate("a", overlap_blocks=10, prefill_blocks=5)
    idle = KvCandidate("b", prefill_blocks=1)
    best, _ = kv_choose([cached_busy, idle], 10, KvWeights(overlap_weight=0.0), random.Random(0))
    assert best.worker_id == "b"


FULL = {"free_blocks": 4, "capacity_blocks": 160}  # a cache under pressure
ROOMY = {"free_blocks": 150, "capacity_blocks": 160}


def test_a_busy_worker_holding_the_prefix_beats_an_idle_one():
    """Three requests decoding on the holder (7 blocks each) weigh less than prefilling 6 blocks
    elsewhere: running sequences are cheap next to prefill, so under cache pressure a prefix is not
    copied around."""
    holder = KvCandidate("a", overlap_blocks=6, decode_blocks=21, requests=3, **FULL)
    idle = KvCandidate("b", **FULL)
    best, costs = kv_choose([holder, idle], 7, W, random.Random(0))
    assert best.worker_id == "a"
    assert costs["a"] == pytest.approx(W.overlap_weight * 2 + 2.1) and costs["b"] == W.overlap_weight * 8


def test_a_prefill_backlog_on_the_holder_sends_the_request_elsewhere():
    holder = KvCandidate("a", overlap_blocks=6, prefill_blocks=20, requests=2, **FULL)
    idle = KvCandidate("b", **FULL)
    best, _ = kv_choose([holder, idle], 7, W, random.Random(0))
    assert best.worker_id == "b"


def test_balance_guard_moves_load_to_an_idle_worker_with_room():
    idle = KvCandidate("b", requests=1, **ROOMY)
    holder = KvCandidate("a", overlap_blocks=7, decode_blocks=35, requests=5, **ROOMY)
    assert kv_choose([holder, idle], 7, W, random.Random(0))[0].worker_id == "b"
    # within the margin (3 vs 1 is 2 more: not past 2, nor past the natural swing 2 * sqrt(2) at a mean
    # of 2 requests) the cache decides
    busyish = KvCandidate("a", overlap_blocks=7, decode_blocks=21, requests=3, **ROOMY)
    assert kv_choose([busyish, idle], 7, W, random.Random(0))[0].worker_id == "a"


def test_the_guards_margin_grows_with_the_natural_swing_of_request_counts():
    """At a mean of m requests a worker, counts spread at random differ by about sqrt(m): the guard
    lets the cheapest run 2 * sqrt(m) more than the idlest (or the absolute threshold, if larger)."""
    assert balance_margin(1, W) == 2 and balance_margin(16, W) == 8 and balance_margin(64, W) == 16
    idle = KvCandidate("b", requests=10, **ROOMY)
    for requests, expected in ((17, "a"), (18, "b")):  # 7 more at a mean of 13.5 (margin 7.3), 8 at 14 (7.5)
        holder = KvCandidate("a", overlap_blocks=7, requests=requests, **ROOMY)
        assert kv_choose([holder, idle], 7, W, random.Random(0))[0].worker_id == expected, requests


def test_a_request_no_cache_favours_goes_where_fewest_run_past_the_absolute_threshold():
    """A new prompt goes to the worker running the fewest requests once the cheapest runs more than
    the absolute threshold (2) more, though that one has no prefill queued and the natural swing at
    this load (2 * sqrt(5.5)) is larger: nothing cached keeps it anywhere. With its prefix cached, the
    same busy worker keeps it. Within the threshold, the cost decides."""
    decoding = KvCandidate("a", decode_blocks=40, requests=7, **ROOMY)
    prefilling = KvCandidate("b", prefill_blocks=8, requests=4, **ROOMY)
    best, costs = kv_choose([decoding, prefilling], 8, W, random.Random(0))
    assert costs["a"] < costs["b"] and best.worker_id == "b"
    holder = KvCandidate("a", overlap_blocks=6, decode_blocks=40, requests=5, **ROOMY)
    assert kv_choose([holder, prefilling], 8, W, random.Random(0))[0].worker_id == "a"
    # a prefix every candidate holds favours none of them
    everywhere = [replace(c, overlap_blocks=6) for c in (decoding, prefilling)]
    assert kv_choose(everywhere, 8, W, random.Random(0))[0].worker_id == "b"
    within = replace(decoding, requests=6)
    assert kv_choose([within, prefilling], 8, W, random.Random(0))[0].worker_id == "a"


def test_a_burst_of_new_prompts_spreads_evenly_while_one_worker_prefills_faster():
    """64 new prompts arriving together on 4 workers, where one worker finishes each prefill at once
    and the others not before the burst ends (its requests then cost only their decode share): that
    worker gets at most 3 more than the others (the absolute threshold, 2, and the one that crosses it),
    as the requests' decode steps are what a worker with more of them slows down."""
    router = Router("kv", rng=random.Random(0))
    workers = [record(w * 16) for w in "abcd"]
    for w in workers:
        router.add_worker(w)
    for i in range(64):
        flight = router.started(router.choose("m", workers, list(range(1000 * i, 1000 * i + 512))))
        if flight.choice.worker.instance_id == "a" * 16:
            flight.first_token()
    counts = sorted(router.load_of(w.instance_id)["requests"] for w in workers)
    assert counts[-1] - counts[0] <= W.balance_abs_threshold + 1, counts


def test_balance_guard_moves_into_a_full_cache_only_past_four_times_the_margin():
    idle = KvCandidate("b", requests=1, **FULL)
    for requests, expected in ((34, "a"), (35, "b")):  # 4 x 2 * sqrt(mean 18): 33.9 more
        holder = KvCandidate("a", overlap_blocks=7, requests=requests, **FULL)  # the guard alone: no decode
        assert kv_choose([holder, idle], 7, W, random.Random(0))[0].worker_id == expected, requests


def test_ties_are_broken_at_random():
    candidates = [KvCandidate(w) for w in "abc"]
    rng = random.Random(1)
    picks = Counter(kv_choose(candidates, 5, W, rng)[0].worker_id for _ in range(300))
    assert set(picks) == {"a", "b", "c"}
    assert min(picks.values()) > 50


def test_ties_only_among_the_cheapest():
    candidates = [KvCandidate("a"), KvCandidate("b"), KvCandidate("c", prefill_blocks=1)]
    rng = random.Random(2)
    picks = {kv_choose(candidates, 5, W, rng)[0].worker_id for _ in range(100)}
    assert picks == {"a", "b"}


def test_empty_candidates_raise():
    with pytest.raises(ValueError):
        kv_choose([], 1, W, random.Random())
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
    router.on_kv_events(stored("b" * 16, 0, prompt[:32]))
    choice = router.choose("m/agg", workers, prompt)
    assert choice.worker.instance_id == "b" * 16
    assert (choice.prompt_blocks, choice.overlap_blocks) == (10, 8)
    assert choice.dp_rank is None  # a worker without data parallelism gets no rank


def test_concurrent_arrivals_of_one_new_prefix_go_to_one_worker_before_any_event():
    """Seven requests sharing a new 28-block prefix arrive at once, before any KV event and before the
    first one's prefill is over, on workers whose caches are under pressure: the first one's blocks are
    predicted on its worker, so the other six follow it (waiting for that prefill beats computing the
    prefix again elsewhere) instead of being spread by load."""
    router = Router("kv", rng=random.Random(5))
    workers = [record(c * 16, total_kv_blocks=40) for c in "abcd"]
    for w in workers:
        router.add_worker(w)
    prefix = list(range(1000, 1112))
    flights = [
        router.started(router.choose("m", workers, [*prefix, 5000 + i, 6000 + i, 7000 + i, 8000 + i]))
        for i in range(7)
    ]
    assert len({f.choice.worker.instance_id for f in flights}) == 1
    assert [f.choice.overlap_blocks for f in flights] == [0] + [28] * 6


@pytest.mark.parametrize(
    ("total_kv_blocks", "followers"),
    [(1000, 3), (12, 30)],
    ids=["room: the guard moves the 4th", "cache pressure: the cost moves the 31st"],
)
def test_arrivals_of_one_prefix_after_its_prefill_follow_it_until_the_balance_guard(
    total_kv_blocks, followers
):
    """The usual case at concurrency: the first request has its first token but its KV events have
    not arrived. Later requests for the prefix go to that worker while it decodes them, until it runs
    more than 2 requests more than an idle worker with room; when no worker has room, the guard waits
    for 4 times the natural swing of request counts (2 * sqrt(mean): 33 more than none), and the cost
    moves the request first, when 30 sequences decoding on the holder outweigh prefilling the prefix
    elsewhere. Either way the next goes to the idle one."""
    router = Router("kv", rng=random.Random(5))
    a, b = (
        record("a" * 16, total_kv_blocks=total_kv_blocks),
        record("b" * 16, total_kv_blocks=total_kv_blocks),
    )
    router.add_worker(a)
    router.add_worker(b)
    prefix = list(range(1000, 1040))
    order = []
    for i in range(followers + 1):
        flight = router.started(router.choose("m", [a, b], [*prefix, 9000 + i]))
        flight.first_token()
        order.append(flight.choice.worker.instance_id)
    holder = order[0]
    other = b.instance_id if holder == a.instance_id else a.instance_id
    assert order == [holder] * followers + [other]


def test_predicted_blocks_expire_unless_confirmed():
    clock = Clock()
    router = Router("kv", rng=random.Random(0), predict_ttl_s=10.0, clock=clock)
    a, b = record("a" * 16), record("b" * 16)
    router.add_worker(a)
    router.add_worker(b)
    prompt = list(range(40))
    first = router.choose("m", [a, b], prompt)
    clock.now += 5
    assert router.choose("m", [a, b], prompt).overlap_blocks == 10  # still predicted (and refreshed)
    clock.now += 16
    assert router.choose("m", [a, b], prompt).overlap_blocks == 0  # expired (this one predicts anew)
    assert (
        router.index.expire(clock.now + 31) == 10 and router.index.block_count(first.worker.instance_id) == 0
    )
    # confirmed by an event: stays after the prediction's time
    holder = router.choose("m", [a, b], prompt).worker.instance_id
    router.on_kv_events(stored(holder, 0, prompt))
    clock.now += 100
    assert router.choose("m", [a, b], prompt).overlap_blocks == 10


def test_an_eviction_event_cancels_a_prediction():
    router = Router("kv", rng=random.Random(0))
    a = record("a" * 16)
    router.add_worker(a)
    prompt = list(range(16))
    router.on_kv_events(stored(a.instance_id, 0, prompt))
    router.choose("m", [a], prompt)  # predicts the same blocks: already stored, nothing more
    router.on_kv_events(
        KvEventBatch(instance_id=a.instance_id, seq=1, events=[BlockRemoved(block_hashes=[3])])
    )
    assert router.choose("m", [a], prompt).overlap_blocks == 3


def test_router_kv_load_and_inflight_spread_identical_workers():
    router = Router("kv", rng=random.Random(0))
    workers = [record("a" * 16), record("b" * 16)]
    for w in workers:
        router.add_worker(w)
    first = router.choose("m", workers, list(range(8)))
    flight = router.started(first)
    second = router.choose("m", workers, list(range(100, 108)))
    assert second.worker.instance_id != first.worker.instance_id
    flight.done()
    flight.done()  # idempotent
    router.on_load(
        LoadMetrics(instance_id="a" * 16, active_blocks=50, total_blocks=100, waiting=0, running=3)
    )
    assert router.choose("m", workers, list(range(200, 208))).worker.instance_id == "b" * 16


def test_first_token_ends_the_prefill_share_of_a_request():
    router = Router("kv", rng=random.Random(0))
    a, b = record("a" * 16), record("b" * 16)
    router.add_worker(a)
    router.add_worker(b)
    one, two = list(range(40)), list(range(200, 240))
    router.on_kv_events(stored(a.instance_id, 0, one))
    router.on_kv_events(stored(a.instance_id, 1, two, first_hash=100))
    # a's backlog: an uncached 40-block prompt still prefilling
    backlog = router.started(router.choose("m", [a], list(range(500, 660))))
    assert router.choose("m", [a, b], one).worker.instance_id == b.instance_id
    backlog.first_token()
    assert router.choose("m", [a, b], two).worker.instance_id == a.instance_id


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
    picks = {router.choose("m", [a, b], [1, 2, 3]).worker.instance_id for _ in range(40)}
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
    router.on_kv_events(stored(a.instance_id, 0, prompt))
    router.started(router.choose("m", [a], prompt)).done()
    # a report sent while our request ran arrives after it finished: it counts our 10 blocks (+1 decoded)
    router.on_load(
        LoadMetrics(instance_id=a.instance_id, active_blocks=11, total_blocks=100, waiting=0, running=1)
    )
    assert router.choose("m", [a, b], prompt).worker.instance_id == a.instance_id


def test_queue_of_other_frontends_counts():
    router = Router("kv", rng=random.Random(0))
    a, b = record("a" * 16), record("b" * 16)
    router.add_worker(a)
    router.add_worker(b)
    router.on_load(
        LoadMetrics(instance_id=a.instance_id, active_blocks=30, total_blocks=100, waiting=2, running=3)
    )
    candidates = [router.choose("m", [a, b], [1, 2, 3]).worker.instance_id for _ in range(10)]
    assert set(candidates) == {b.instance_id}


def test_dp_ranks_are_routed_by_their_own_cache():
    """A worker with two attention dp ranks: rank 1's events make rank 1 the choice for that prefix,
    another prefix cached on rank 0 goes to rank 0."""
    router = Router("kv", rng=random.Random(0))
    w = record("a" * 16, dp_size=2)
    router.add_worker(w)
    one, zero = list(range(40)), list(range(300, 340))
    router.on_kv_events(stored(w.instance_id, 0, one, dp_rank=1))
    router.on_kv_events(stored(w.instance_id, 1, zero, dp_rank=0, first_hash=100))
    c1 = router.choose("m", [w], one)
    c0 = router.choose("m", [w], zero)
    assert (c1.dp_rank, c1.overlap_blocks) == (1, 10)
    assert (c0.dp_rank, c0.overlap_blocks) == (0, 10)
    assert router.index.block_count(w.instance_id, 1) == 10


def test_dp_ranks_share_new_prefixes_by_load():
    router = Router("kv", rng=random.Random(0))
    w = record("a" * 16, dp_size=2)
    router.add_worker(w)
    first = router.started(router.choose("m", [w], list(range(40))))
    second = router.choose("m", [w], list(range(500, 540)))
    assert {first.choice.dp_rank, second.dp_rank} == {0, 1}


def test_a_worker_without_kv_events_is_reported_once(caplog):
    router = Router("kv", rng=random.Random(0))
    a = record("a" * 16)
    router.add_worker(a)
    with caplog.at_level(logging.WARNING, logger="dynamo_worker.router.router"):
        for i in range(6):
            router.started(router.choose("m", [a], list(range(i * 100, i * 100 + 40)))).done()
    warnings = [r.getMessage() for r in caplog.records if "publishes no KV events" in r.getMessage()]
    assert len(warnings) == 1 and "--kv-events-config" in warnings[0]
    assert router.silent_workers() == [a.instance_id]


def test_a_worker_with_kv_events_is_not_reported(caplog):
    router = Router("kv", rng=random.Random(0))
    a = record("a" * 16)
    router.add_worker(a)
    router.on_kv_events(stored(a.instance_id, 0, list(range(8))))
    with caplog.at_level(logging.WARNING, logger="dynamo_worker.router.router"):
        for i in range(6):
            router.started(router.choose("m", [a], list(range(i * 100, i * 100 + 40)))).done()
    assert router.silent_workers() == []
