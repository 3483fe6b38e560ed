"""Pruning decisions and apply outcomes: only our own children that are no longer desired are pruned,
and status-only changes by controllers are not reported as updates."""

from dynamo_operator.reconcile.apply_rules import apply_outcome, fingerprint, needs_apply, to_prune

OWNER = "uid-graph"


def obj(kind: str, name: str, owner: str | None = OWNER, **meta) -> dict:
    refs = [{"kind": "DynamoGraphDeployment", "name": "g", "uid": owner, "controller": True}] if owner else []
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "ownerReferences": refs, **meta},
    }


def test_prunes_only_undesired_children_of_this_owner():
    observed = [
        obj("Deployment", "g-frontend"),
        obj("Deployment", "g-decode"),  # removed from the spec
        obj("Deployment", "g-other", owner="uid-someone-else"),
        obj("Deployment", "g-unowned", owner=None),
        obj("StatefulSet", "g-frontend"),  # same name, other kind: not desired
    ]
    desired = [obj("Deployment", "g-frontend")]
    pruned = to_prune(observed, desired, OWNER)
    assert [(o["kind"], o["metadata"]["name"]) for o in pruned] == [
        ("Deployment", "g-decode"),
        ("StatefulSet", "g-frontend"),
    ]


def test_nothing_to_prune_when_everything_is_desired():
    observed = [obj("Deployment", "a"), obj("Deployment", "b")]
    assert to_prune(observed, observed, OWNER) == []


def managed(fields: str, time: str) -> list[dict]:
    return [
        {"manager": "dynamo-sglang-operator", "operation": "Apply", "fieldsV1": {"f": fields}, "time": time},
        {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status", "time": time},
    ]


def test_apply_outcome_created_updated_unchanged():
    before = obj("Deployment", "a", generation=1, resourceVersion="10", managedFields=managed("x", "t1"))
    assert apply_outcome(None, before, "dynamo-sglang-operator") == "Created"
    status_only = obj("Deployment", "a", generation=1, resourceVersion="11", managedFields=managed("x", "t1"))
    assert apply_outcome(before, status_only, "dynamo-sglang-operator") is None
    new_spec = obj("Deployment", "a", generation=2, resourceVersion="12", managedFields=managed("x", "t2"))
    assert apply_outcome(before, new_spec, "dynamo-sglang-operator") == "Updated"
    new_label = obj("Deployment", "a", generation=1, resourceVersion="13", managedFields=managed("y", "t2"))
    assert apply_outcome(before, new_label, "dynamo-sglang-operator") == "Updated"


def test_needs_apply_only_when_manifest_object_or_our_fields_changed():
    desired = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "a"},
        "spec": {"replicas": 1},
    }
    applied = obj("Deployment", "a", uid="u1", managedFields=managed("x", "t1"))
    last = fingerprint(desired, applied, "dynamo-sglang-operator")
    assert needs_apply(desired, None, last, "dynamo-sglang-operator")  # deleted
    assert needs_apply(desired, applied, None, "dynamo-sglang-operator")  # never applied by this process
    assert not needs_apply(desired, applied, last, "dynamo-sglang-operator")
    status_changed = obj("Deployment", "a", uid="u1", resourceVersion="99", managedFields=managed("x", "t1"))
    assert not needs_apply(desired, status_changed, last, "dynamo-sglang-operator")
    edited = obj("Deployment", "a", uid="u1", managedFields=managed("x-minus-replicas", "t1"))
    assert needs_apply(desired, edited, last, "dynamo-sglang-operator")  # someone took a field from us
    scaled = {**desired, "spec": {"replicas": 2}}
    assert needs_apply(scaled, applied, last, "dynamo-sglang-operator")  # the spec changed
