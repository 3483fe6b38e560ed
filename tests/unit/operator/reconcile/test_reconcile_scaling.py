"""Deciding the writes around scaling adapters: which adapter replicas to copy into the graph (only this
graph's desired adapters, only when they differ), the guarded JSON patch on the stored v1beta1 graph,
restoring an adapter's labels and dgdRef but never its replicas, its status, and the ScalingConflict
condition with the problem and the fix."""

from __future__ import annotations

from dynamo_operator.reconcile.scaling import (
    adapter_drift,
    adapter_status,
    conflict_condition,
    replicas_patch,
    replicas_to_copy,
)
from dynamo_operator.render.types import ScalingConflict


def _adapter(name: str, service: str, replicas: int, uid: str = "g-uid") -> dict:
    return {
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "dynamo-sglang-operator"},
            "ownerReferences": [{"kind": "DynamoGraphDeployment", "uid": uid, "controller": True}],
        },
        "spec": {"replicas": replicas, "dgdRef": {"name": "g", "serviceName": service}},
    }


def test_only_differing_replicas_of_this_graphs_desired_adapters_are_copied():
    desired = [_adapter("g-decode", "decode", 1), _adapter("g-prefill", "prefill", 1)]
    observed = [
        _adapter("g-decode", "decode", 3),  # scaled by HPA/kubectl: copy
        _adapter("g-prefill", "prefill", 1),  # equal: nothing
        _adapter("g-old", "old", 5),  # not desired (opted out): will be deleted, never copied
    ]
    current = {"decode": 1, "prefill": 1, "old": 1}
    assert replicas_to_copy(observed, desired, current, "g-uid") == {"decode": 3}
    assert replicas_to_copy(observed, desired, {"decode": 3, "prefill": 1}, "g-uid") == {}
    # an adapter of an earlier graph of the same name (another uid) is not this graph's
    assert replicas_to_copy([_adapter("g-decode", "decode", 3, uid="old")], desired, current, "g-uid") == {}
    # an adapter edited to point at another service is restored first, not copied
    moved = _adapter("g-decode", "prefill", 7)
    assert replicas_to_copy([moved], desired, current, "g-uid") == {}


def test_replicas_patch_targets_each_component_by_index_guarded_by_its_name():
    graph = {"spec": {"components": [{"name": "Frontend"}, {"name": "decode", "replicas": 1}, {"name": "p"}]}}
    assert replicas_patch(graph, {"decode": 4, "p": 0}) == [
        {"op": "test", "path": "/spec/components/1/name", "value": "decode"},
        {"op": "add", "path": "/spec/components/1/replicas", "value": 4},
        {"op": "test", "path": "/spec/components/2/name", "value": "p"},
        {"op": "add", "path": "/spec/components/2/replicas", "value": 0},
    ]


def test_drift_restores_labels_and_dgd_ref_never_replicas():
    desired = _adapter("g-decode", "decode", 1)
    observed = _adapter("g-decode", "decode", 9)
    assert adapter_drift(desired, observed) is None
    observed["metadata"]["labels"] = {"other": "x"}
    observed["spec"]["dgdRef"]["serviceName"] = "prefill"
    assert adapter_drift(desired, observed) == {
        "metadata": {"labels": desired["metadata"]["labels"]},
        "spec": {"dgdRef": {"name": "g", "serviceName": "decode"}},
    }


def test_status_reports_existing_replicas_and_the_selector_and_is_written_only_on_change():
    observed = _adapter("g-decode", "decode", 3)
    assert adapter_status(observed, 2, "a=b", None) == {"status": {"replicas": 2, "selector": "a=b"}}
    observed["status"] = {"replicas": 2, "selector": "a=b", "lastScaleTime": "t0"}
    assert adapter_status(observed, 2, "a=b", None) is None
    assert adapter_status(observed, 2, "a=b", "t1") == {
        "status": {"replicas": 2, "selector": "a=b", "lastScaleTime": "t1"}
    }


def test_conflict_condition_names_the_problem_and_the_fix():
    assert conflict_condition((), ()) is None
    ok = conflict_condition((), (_adapter("g-decode", "decode", 1),))
    assert (ok.type, ok.status, ok.reason) == ("ScalingConflict", "False", "NoConflict")
    cond = conflict_condition((ScalingConflict("decode", "Planner", "g-decode"),), ())
    assert (cond.type, cond.status, cond.reason) == ("ScalingConflict", "True", "PlannerScalesService")
    assert "service decode sets scalingAdapter but planner Planner scales it" in cond.message
    assert "no DynamoGraphDeploymentScalingAdapter g-decode" in cond.message
    assert "remove scalingAdapter from the service" in cond.message and "remove the planner" in cond.message
