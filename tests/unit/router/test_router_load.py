"""The router's load terms from the engines' reports: queued prefill tokens steer a request away, a
report counts our own requests only once, a burst between two reports spreads by our own counts, an
older worker's report (no token count) still counts its queue; disaggregated flights by role (a
prefill worker's share ends with its leg, a decode worker holds the prompt's KV from dispatch); the
decode choice by free KV (a full decode worker is avoided: it would stall the prefill too) and the pair
choice restricted to allowed (warm) combinations."""

from __future__ import annotations

import random
from collections import Counter

from dynamo_worker.protocol import InstanceRecord, LoadMetrics
from dynamo_worker.router.policy import DecodeCandidate, KvWeights, decode_cost, decode_rank
from dynamo_worker.router.router import Router

PAGE = 4
A, B, C, D = "a" * 16, "b" * 16, "c" * 16, "d" * 16


def record(worker_id: str, role: str = "agg", total_kv_blocks: int = 1000) -> InstanceRecord:
    return InstanceRecord(
        instance_id=worker_id,
        namespace="ns",
        component=role,
        role=role,  # type: ignore[arg-type]
        model="m",
        address="127.0.0.1:1",
        page_size=PAGE,
        total_kv_blocks=total_kv_blocks,
    )


def report(worker_id: str, **fields: int) -> LoadMetrics:
    base = {"active_blocks": 0, "total_blocks": 1000, "waiting": 0, "running": 0}
    return LoadMetrics(instance_id=worker_id, **{**base, **fields})


def router(*records: InstanceRecord) -> Router:
    r = Router("kv", rng=random.Random(0))
    for rec in records:
        r.add_worker(rec)
    return r


def prompt(i: int, blocks: int = 10) -> list[int]:
    return list(range(1000 * i, 1000 * i + blocks * PAGE))


def test_queued_prefill_tokens_reported_by_the_engine_steer_requests_away():
    a, b = record(A), record(B)
    r = router(a, b)
    # another frontend's 30 blocks of prefill wait on a: three of our 10-block prompts fit on b first
    r.on_load(report(A, waiting=3, running=0, waiting_prefill_tokens=30 * PAGE))
    picks = []
    for i in range(3):
        choice = r.choose("m", [a, b], prompt(i))
        r.started(choice)
        picks.append(choice.worker.instance_id)
    assert picks == [B, B, B]
    # the 4th ties (a: 30 of others + ... b: 33 of ours): both are now equally loaded
    assert r.load_of(A)["others_prefill"] == 30 and r.load_of(B)["prefill"] == 33


def test_a_report_counts_our_own_requests_once():
    a, b = record(A), record(B)
    r = router(a, b)
    flights = [r.started(r.choose("m", [a], prompt(i))) for i in range(3)]  # 3 x 11 new blocks on a
    # a's engine reports exactly our three requests queued: nothing of other frontends
    r.on_load(report(A, waiting=3, running=0, waiting_prefill_tokens=33 * PAGE, active_blocks=30))
    assert r.load_of(A)["others_prefill"] == 0 and r.load_of(A)["others_blocks"] == 0
    assert r.load_of(A)["others_requests"] == 0
    for f in flights:
        f.done()
    # a report taken while they ran arrives after they ended: still ours (the window's peak), not others'
    r.on_load(report(A, waiting=3, running=0, waiting_prefill_tokens=33 * PAGE))
    assert r.load_of(A)["others_prefill"] == 0
    # the next report after that window counts what is really there beyond ours
    r.on_load(report(A, waiting=1, waiting_prefill_tokens=8 * PAGE))
    assert r.load_of(A)["others_prefill"] == 8


def test_a_prefill_workers_bootstrap_queue_counts_our_requests_whole_and_only_once():
    """SGLang's prefill worker counts a request waiting in its bootstrap queue (for its decode leg's
    handshake) whole, as it matches it against its cache only when it leaves. Our two returning turns of
    10 blocks, 8 of them cached, are 2 x 3 new blocks to us and 2 x 10 whole in the report: that is still
    nothing of other frontends, so the worker caching a conversation keeps its next turn."""
    a, b = record(A, "prefill"), record(B, "prefill")
    r = router(a, b)
    for i in range(3):  # each conversation's first turn of 8 blocks went to a (which now caches it)
        r.started(r.choose("m", [a], prompt(i, 8)), "prefill").done()
    flights = [r.started(r.choose("m", [a], prompt(i)), "prefill") for i in range(2)]
    assert all(f.choice.new_blocks == 3 for f in flights)
    r.on_load(report(A, waiting=0, running=0, bootstrap_queue=2, waiting_prefill_tokens=2 * 10 * PAGE))
    assert r.load_of(A)["others_prefill"] == 0
    # a: 1.5 x 3 new + 6 of ours queued = 10.5 against b's 1.5 x 11 = 16.5 (with 14 invented: 24.5)
    assert r.choose("m", [a, b], prompt(2)).worker.instance_id == A
    # with nothing in the bootstrap queue the report counts uncached blocks only, and so do we
    r.on_load(report(A, waiting=2, running=0, waiting_prefill_tokens=2 * 3 * PAGE + 5 * PAGE))
    assert r.load_of(A)["others_prefill"] == 5


def test_a_burst_between_two_reports_spreads_by_our_own_counts():
    workers = [record(A), record(B), record(C)]
    r = router(*workers)
    for w in workers:
        r.on_load(report(w.instance_id))  # idle, and no report comes during the burst
    picks = Counter(r.started(r.choose("m", workers, prompt(i))).choice.worker.instance_id for i in range(12))
    assert picks == {A: 4, B: 4, C: 4}


def test_an_older_workers_report_without_token_counts_still_counts_its_queue():
    a, b = record(A), record(B)
    r = router(a, b)
    r.on_load(report(A, waiting=5, running=2))  # no waiting_prefill_tokens: one block per waiting request
    assert r.load_of(A)["others_prefill"] == 5 and r.load_of(A)["others_requests"] == 7
    assert r.choose("m", [a, b], prompt(1)).worker.instance_id == B


def test_a_prefill_workers_share_ends_with_its_leg_and_a_decode_worker_holds_kv_from_dispatch():
    p, d = record(A, "prefill"), record(B, "decode")
    r = router(p, d)
    first, second = r.choose_pair("m", [p], [d], prompt(1))
    prefill_flight, decode_flight = r.started(first, "prefill"), r.started(second, "decode")
    assert r.load_of(A)["prefill"] == 11 and r.load_of(B)["prefill"] == 0
    assert r._decode_blocks[B] == 10  # the decode worker reserved the prompt's KV at once
    prefill_flight.done()  # the prefill leg ended: its KV moved to the decode worker
    assert r.load_of(A) == {**r.load_of(A), "prefill": 0, "blocks": 0, "requests": 0}
    decode_flight.first_token()
    prefill_flight.first_token()  # idempotent after done
    assert r._decode_blocks[B] == 10 and r.load_of(B)["requests"] == 1
    decode_flight.done()
    assert r._decode_blocks[B] == 0 and r.load_of(B)["requests"] == 0


def test_decode_workers_without_room_for_the_prompt_come_last():
    weights = KvWeights()
    roomy = DecodeCandidate(worker_id=A, held_blocks=900, capacity_blocks=1000)
    full = DecodeCandidate(worker_id=B, held_blocks=950, capacity_blocks=1000)
    assert decode_cost(roomy, weights) < decode_cost(full, weights)
    assert decode_rank(roomy, 50, weights) < decode_rank(full, 50, weights)
    # without room, a cheaper one still loses to one with room
    emptier_but_small = DecodeCandidate(worker_id=C, held_blocks=10, capacity_blocks=40)
    assert decode_rank(roomy, 50, weights) < decode_rank(emptier_but_small, 50, weights)


def test_the_decode_choice_avoids_a_decode_worker_whose_kv_is_full():
    p, d1, d2 = record(A, "prefill"), record(B, "decode", 100), record(C, "decode", 100)
    r = router(p, d1, d2)
    r.on_load(report(B, active_blocks=95, total_blocks=100, running=9))  # others' sequences fill it
    picks = {r.choose_pair("m", [p], [d1, d2], prompt(i))[1].worker.instance_id for i in range(10)}
    assert picks == {C}


def test_a_prefill_worker_whose_decode_partners_are_full_gives_way_to_one_with_room():
    """One decision: prefill a is idle but may only pair with the full decode worker; b may pair with
    the roomy one, so b is chosen (a would wait in SGLang's bootstrap queue for memory)."""
    pa, pb = record(A, "prefill"), record(B, "prefill")
    full, roomy = record(C, "decode", 100), record(D, "decode", 100)
    r = router(pa, pb, full, roomy)
    r.on_load(report(C, active_blocks=99, total_blocks=100, running=9))
    r.started(r.choose("m", [pb], prompt(9)), "prefill")  # b has a prefill queued, a none
    allowed = {(A, C), (B, D)}
    first, second = r.choose_pair("m", [pa, pb], [full, roomy], prompt(1), lambda x, y: (x, y) in allowed)
    assert (first.worker.instance_id, second.worker.instance_id) == (B, D)


def test_only_allowed_pairs_are_chosen():
    ps = [record(A, "prefill"), record(B, "prefill")]
    ds = [record(C, "decode"), record(D, "decode")]
    for mode in ("kv", "round-robin", "random"):
        r = Router(mode, rng=random.Random(1))  # type: ignore[arg-type]
        for w in (*ps, *ds):
            r.add_worker(w)
        pairs = {
            (f.worker.instance_id, s.worker.instance_id)
            for f, s in (
                r.choose_pair("m", ps, ds, prompt(i), lambda x, y: (x, y) == (B, C)) for i in range(8)
            )
        }
        assert pairs == {(B, C)}, mode
