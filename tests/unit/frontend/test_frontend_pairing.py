"""Revision-coherent pairing: a prefill and a decode worker are paired only when they share a revision,
the newest revision that has both roles wins (by the earliest start of its workers, so one restarted
old worker does not make its revision new), a revision with one role only is named, and the dispatcher
refuses to mix revisions with a 503 that says why (never a request to a mixed pair)."""

from __future__ import annotations

import itertools

import pytest
from dynamo_worker.frontend.errors import ServiceUnavailable
from dynamo_worker.frontend.models.pairing import newest_pair, no_pair_message, unpaired
from dynamo_worker.frontend.models.registry import ModelEntry
from dynamo_worker.frontend.serving.dispatch import Dispatcher
from dynamo_worker.protocol import InstanceRecord
from dynamo_worker.router import Router
from dynamo_worker.runtime.request_plane import RequestClient

_ids = itertools.count(1)


def worker(role: str, revision: str | None, started_at: float | None = None) -> InstanceRecord:
    i = next(_ids)
    return InstanceRecord(
        instance_id=f"{i:016x}",
        namespace="ns",
        component=role,
        role=role,
        model="m",
        address=f"127.0.0.1:{2000 + i}",
        page_size=16,
        total_kv_blocks=10,
        revision=revision,
        started_at=started_at,
    )


def test_pairs_only_within_a_revision():
    p_old, d_new = worker("prefill", "old", 1.0), worker("decode", "new", 2.0)
    assert newest_pair([p_old], [d_new]) is None
    p_new = worker("prefill", "new", 3.0)
    pair = newest_pair([p_old, p_new], [d_new])
    assert pair is not None and pair.revision == "new"
    assert pair.prefill == (p_new,) and pair.decode == (d_new,)


def test_newest_complete_revision_wins_during_a_rollout():
    old = [worker("prefill", "r1", 10.0), worker("decode", "r1", 11.0)]
    new = [worker("prefill", "r2", 100.0), worker("decode", "r2", 101.0)]
    pair = newest_pair([old[0], new[0]], [old[1], new[1]])
    assert pair is not None and pair.revision == "r2"


def test_a_restarted_old_worker_does_not_make_its_revision_newest():
    old = [worker("prefill", "r1", 10.0), worker("decode", "r1", 500.0)]  # decode restarted late
    new = [worker("prefill", "r2", 100.0), worker("decode", "r2", 101.0)]
    pair = newest_pair([old[0], new[0]], [old[1], new[1]])
    assert pair is not None and pair.revision == "r2"


def test_workers_without_a_revision_pair_with_each_other_only():
    bare_p, bare_d, rev_d = worker("prefill", None), worker("decode", None), worker("decode", "r")
    pair = newest_pair([bare_p], [bare_d, rev_d])
    assert pair is not None and pair.revision is None and pair.decode == (bare_d,)


def test_unpaired_names_revisions_with_one_role():
    prefill = [worker("prefill", "r1"), worker("prefill", "r2"), worker("prefill", "r2")]
    decode = [worker("decode", "r1"), worker("decode", "r3")]
    assert unpaired(prefill, decode) == {("r2", "prefill"): 2, ("r3", "decode"): 1}


def entry(*workers: InstanceRecord) -> ModelEntry:
    e = ModelEntry("m")
    for w in workers:
        e.workers[w.instance_id] = w
    return e


@pytest.fixture
def dispatcher() -> Dispatcher:
    """Planning only: the request-plane client is never used (no connection is opened)."""
    return Dispatcher(
        Router("round-robin"),
        RequestClient(connect_timeout_s=1, first_token_timeout_s=1, inter_token_timeout_s=1),
    )


def test_dispatcher_never_mixes_revisions(dispatcher):
    p1, d1 = worker("prefill", "r1", 1.0), worker("decode", "r1", 1.0)
    p2, d2 = worker("prefill", "r2", 2.0), worker("decode", "r2", 2.0)
    e = entry(p1, d1, p2, d2)
    for _ in range(6):
        route = dispatcher.route(e, [1, 2, 3])
        assert route.decode is not None
        assert route.first.worker.revision == route.decode.worker.revision == "r2"
    # r2's decode worker is lost to this request: r1 is the only complete revision left
    route = dispatcher.route(e, [1, 2, 3], exclude=frozenset({d2.instance_id}))
    assert route.decode is not None and route.first.worker is p1 and route.decode.worker is d1


def test_dispatcher_answers_503_naming_the_revisions_when_none_is_complete(dispatcher):
    e = entry(worker("prefill", "old"), worker("decode", "new"))
    assert not e.can_serve()
    with pytest.raises(ServiceUnavailable) as raised:
        dispatcher.route(e, [1, 2, 3])
    err = raised.value
    assert err.code == "no_matching_revision" and err.headers["Retry-After"] == "1"
    assert "old" in err.message and "new" in err.message and "share a revision" in err.message
    assert err.message == no_pair_message("m", e.by_role("prefill"), e.by_role("decode"))


def test_user_requests_take_warm_combinations_while_there_is_one():
    """``routable_pair``: every combination warm -> no filter; some warm -> only those; the newest
    revision not warm yet -> the older revision's warm ones; nothing warm anywhere -> the newest, any."""
    from dynamo_worker.frontend.models.pairing import WarmPairs, routable_pair

    p_old, d_old = worker("prefill", "old", 1.0), worker("decode", "old", 1.0)
    p1, p2, d1 = worker("prefill", "new", 2.0), worker("prefill", "new", 2.0), worker("decode", "new", 2.0)
    prefill, decode = [p_old, p1, p2], [d_old, d1]
    warm = WarmPairs()

    def route():
        found = routable_pair(newest_pair(prefill, decode), prefill, decode, warm.is_warm)
        assert found is not None
        pair, allowed = found
        combos = {(p.instance_id, d.instance_id) for p in pair.prefill for d in pair.decode}
        return pair.revision, combos if allowed is None else {c for c in combos if allowed(*c)}

    # a fresh graph: nothing warm, the newest revision, any combination (never a refusal)
    assert route() == ("new", {(p1.instance_id, d1.instance_id), (p2.instance_id, d1.instance_id)})
    warm.set(p_old.instance_id, d_old.instance_id, "warm")  # a rollout: the old pair is warm
    warm.set(p1.instance_id, d1.instance_id, "warming")
    assert route() == ("old", {(p_old.instance_id, d_old.instance_id)})
    warm.set(p1.instance_id, d1.instance_id, "warm")
    assert route() == ("new", {(p1.instance_id, d1.instance_id)})
    warm.set(p2.instance_id, d1.instance_id, "failed")
    assert route() == ("new", {(p1.instance_id, d1.instance_id)})
    warm.set(p2.instance_id, d1.instance_id, "warm")
    assert route() == ("new", {(p1.instance_id, d1.instance_id), (p2.instance_id, d1.instance_id)})
