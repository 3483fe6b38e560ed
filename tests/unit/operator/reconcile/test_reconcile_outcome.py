"""The Events of a visit come from the transition of the graph's status alone (``events_for``): what the
visit changed, an invalid spec or a rejected object once, a Ready graph that is no longer ready (Normal
during the user's own rollout, else Warning), render's notices for a new generation, a scaling conflict
and Ready when they become true. A visit that changes nothing after its status was written posts no
Event, whatever the outcome."""

import pytest
from dynamo_operator.reconcile.conditions import (
    Cond,
    apply_failed_condition,
    invalid_condition,
)
from dynamo_operator.reconcile.outcome import (
    Change,
    Event,
    Outcome,
    events_for,
    lost_readiness,
    status_for,
)
from dynamo_operator.reconcile.status import ServiceCounts, ready_condition
from dynamo_operator.render.types import Notice, Problem

PODS = "nvidia.com/dynamo-graph-deployment-name=g"
WAITING = ready_condition({"decode": ServiceCounts("Deployment", 1, 0, 0, 1)}, PODS)
READY = ready_condition({"decode": ServiceCounts("Deployment", 1, 1, 1, 1)}, PODS)
TCP = Notice("TcpTransport", "prefill/decode: NIXL over TCP", "decode")
TP = Notice("TpMismatch", "decode: --tp 4 but 8 GPUs", "decode", warning=True)
CONFLICT = Cond("ScalingConflict", "True", "PlannerScalesService", "service decode ...")


def outcome(ready: Cond = WAITING, generation: int = 1, **kw) -> Outcome:
    state = "successful" if ready.status == "True" else "pending"
    return Outcome(generation, ready, kw.pop("state", state), **kw)


def written(old: dict, new: Outcome) -> dict:
    """The status after ``new`` was written over ``old``."""
    return status_for(old, new, now="2026-01-01T00:00:00Z", group_backend="lws")


def kinds(events: list[Event]) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in events]


def test_a_first_visit_tells_what_it_created_and_what_render_said():
    new = outcome(notices=(TCP, TP), changes=(Change("Created", "Created Deployment g-decode"),), counts={})
    assert kinds(events_for({}, new)) == [
        ("Normal", "Created"),
        ("Normal", "TcpTransport"),
        ("Warning", "TpMismatch"),
    ]
    assert events_for({}, new)[0].message == "Created Deployment g-decode"


OUTCOMES = {
    "waiting": outcome(notices=(TCP,)),
    "ready": outcome(READY, notices=(TP,)),
    "invalid": outcome(
        invalid_condition((Problem("spec.x", "MissingGpuLimit", "set it"),)),
        state="failed",
        problems=(Problem("spec.x", "MissingGpuLimit", "set it"),),
    ),
    "rejected": outcome(apply_failed_condition(["Deployment g-decode: bad"]), state="failed"),
    "conflict": outcome(READY, scaling=CONFLICT),
}


@pytest.mark.parametrize("name", OUTCOMES)
def test_a_visit_that_changes_nothing_posts_no_event(name):
    new = OUTCOMES[name]
    assert events_for({}, new), "the first visit says something"
    assert events_for(written({}, new), new) == []


def test_an_invalid_spec_warns_once_per_problem_and_again_for_a_new_generation():
    problems = (Problem("spec.a", "X", "x"), Problem("spec.b", "Y", "y"))
    new = outcome(invalid_condition(problems), state="failed", problems=problems)
    assert [(e.type, e.reason, e.message) for e in events_for({}, new)] == [
        ("Warning", "X", "spec.a: x"),
        ("Warning", "Y", "spec.b: y"),
    ]
    again = outcome(invalid_condition(problems), generation=2, state="failed", problems=problems)
    assert kinds(events_for(written({}, new), again)) == [("Warning", "X"), ("Warning", "Y")]


def test_a_rejected_object_warns_when_the_message_is_new():
    first = outcome(apply_failed_condition(["Deployment g-decode: bad"]), state="failed")
    other = outcome(apply_failed_condition(["Deployment g-decode: worse"]), state="failed")
    assert kinds(events_for({}, first)) == [("Warning", "ApplyFailed")]
    assert kinds(events_for(written({}, first), other)) == [("Warning", "ApplyFailed")]


def test_losing_readiness_warns_unless_the_users_own_change_rolls_out():
    was_ready = written({}, outcome(READY))
    assert kinds(events_for(was_ready, outcome(WAITING))) == [("Warning", "ServicesNotReady")]
    rollout = kinds(events_for(was_ready, outcome(WAITING, generation=2)))
    assert rollout[0] == ("Normal", "ServicesNotReady")


def test_losing_readiness_is_worth_an_event_once():
    """Ready True -> False (a pod crashed, a node went away) is worth an Event; staying False is not."""
    was_ready = [{"type": "Ready", "status": "True", "reason": "AllServicesReady", "message": "m"}]
    assert lost_readiness(was_ready, WAITING)
    assert not lost_readiness([{"type": "Ready", "status": "False"}], WAITING)
    assert not lost_readiness([], WAITING)
    assert not lost_readiness(was_ready, READY)


def test_ready_and_a_scaling_conflict_are_told_when_they_become_true():
    waiting = written({}, outcome(WAITING))
    assert kinds(events_for(waiting, outcome(READY, scaling=CONFLICT))) == [
        ("Warning", "PlannerScalesService"),
        ("Normal", "Ready"),
    ]


def test_changes_are_told_in_order_even_when_status_is_unchanged():
    new = outcome(READY)
    changes = (Change("Deleted", "Deleted Service g-x: no longer in the spec"), Change("Scaled", "s"))
    again = Outcome(new.generation, new.ready, new.state, changes=changes)
    assert [(e.reason, e.message) for e in events_for(written({}, new), again)] == [
        ("Deleted", "Deleted Service g-x: no longer in the spec"),
        ("Scaled", "s"),
    ]


def test_status_names_the_generation_and_keeps_services_when_counts_are_unknown():
    old = {"services": {"decode": {"replicas": 1}}}
    rejected = written(old, outcome(apply_failed_condition(["x"]), generation=4, state="failed"))
    assert rejected["observedGeneration"] == 4 and "services" not in rejected
    counted = written(old, outcome(READY, counts={"decode": ServiceCounts("Deployment", 1, 1, 1, 1)}))
    assert counted["services"]["decode"]["readyReplicas"] == 1
    assert [c["type"] for c in counted["conditions"]] == ["Ready", "SpecWarnings"]
