"""Conditions keep lastTransitionTime while their status is unchanged; changes are detected on what a
person reads (status, reason, message)."""

from dynamo_operator.reconcile.conditions import Cond, changed, merge


def test_merge_keeps_transition_time_when_status_unchanged():
    current = [
        {"type": "Ready", "status": "False", "reason": "A", "message": "m", "lastTransitionTime": "t0"}
    ]
    out = merge(current, [Cond("Ready", "False", "B", "other")], now="t1", generation=3)
    assert out == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "B",
            "message": "other",
            "lastTransitionTime": "t0",
            "observedGeneration": 3,
        }
    ]


def test_merge_sets_transition_time_on_status_change_and_drops_unwanted_types():
    current = [
        {"type": "Ready", "status": "False", "reason": "A", "message": "m", "lastTransitionTime": "t0"},
        {"type": "Old", "status": "True", "reason": "X", "message": "x", "lastTransitionTime": "t0"},
    ]
    out = merge(current, [Cond("Ready", "True", "Ok", "fine")], now="t1", generation=None)
    assert out == [
        {"type": "Ready", "status": "True", "reason": "Ok", "message": "fine", "lastTransitionTime": "t1"}
    ]


def test_changed():
    current = [{"type": "Ready", "status": "True", "reason": "Ok", "message": "fine"}]
    assert not changed(current, Cond("Ready", "True", "Ok", "fine"))
    assert changed(current, Cond("Ready", "True", "Ok", "finer"))
    assert changed(current, Cond("Other", "True", "Ok", "fine"))
