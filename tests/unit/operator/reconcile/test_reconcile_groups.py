"""Multinode group restarts (StatefulSet backend): which pod events restart a group, which pods are
deleted, and that the operator's own restart deletions never trigger another restart."""

from dynamo_operator.reconcile.groups import (
    RESTART_ANNOTATION,
    owner_statefulset,
    pods_to_restart,
    restart_mark,
    restart_trigger,
)

GROUP = "nvidia.com/dynamo-group"


def pod(name: str, *, group: str | None = "g-decode-0", owner: str = "StatefulSet", **extra) -> dict:
    meta = {
        "name": name,
        "uid": f"uid-{name}",
        "labels": {GROUP: group} if group else {},
        "annotations": extra.pop("annotations", {}),
        "ownerReferences": [{"kind": owner, "name": "g-decode-0-w", "controller": True}],
    }
    if "deletionTimestamp" in extra:
        meta["deletionTimestamp"] = extra.pop("deletionTimestamp")
    return {"metadata": meta, "status": extra.pop("status", {"phase": "Running"})}


def test_deleted_pod_triggers_restart():
    assert restart_trigger(pod("a"), "DELETED", group_label=GROUP) == "PodDeleted"
    assert restart_trigger(pod("a", deletionTimestamp="now"), "MODIFIED", group_label=GROUP) == "PodDeleted"


def test_failed_or_restarted_pod_triggers_restart():
    assert restart_trigger(pod("a", status={"phase": "Failed"}), "MODIFIED", group_label=GROUP) == "PodFailed"
    crashed = pod(
        "a", status={"phase": "Running", "containerStatuses": [{"name": "main", "restartCount": 1}]}
    )
    assert restart_trigger(crashed, "MODIFIED", group_label=GROUP) == "ContainerRestarted"


def test_healthy_marked_ungrouped_or_lws_pods_trigger_nothing():
    assert restart_trigger(pod("a"), "MODIFIED", group_label=GROUP) is None
    assert restart_trigger(pod("a"), None, group_label=GROUP) is None
    marked = pod("a", annotations={RESTART_ANNOTATION: "uid-x"})
    assert restart_trigger(marked, "DELETED", group_label=GROUP) is None
    assert restart_trigger(pod("a", group=None), "DELETED", group_label=GROUP) is None
    assert restart_trigger(pod("a", owner="LeaderWorkerSet"), "DELETED", group_label=GROUP) is None


def test_pods_to_restart_skips_terminating_and_marked_pods():
    pods = [
        pod("c"),
        pod("a"),
        pod("b", deletionTimestamp="now"),
        pod("d", annotations={RESTART_ANNOTATION: "uid-x"}),
    ]
    assert [p["metadata"]["name"] for p in pods_to_restart(pods)] == ["a", "c"]


def test_restart_mark_and_owner():
    assert restart_mark("uid-a", "uid-b") == {
        "metadata": {"uid": "uid-b", "annotations": {RESTART_ANNOTATION: "uid-a"}}
    }
    assert owner_statefulset(pod("a")) == "g-decode-0-w"
    assert owner_statefulset(pod("a", owner="ReplicaSet")) is None
