"""Multinode group semantics for the StatefulSet backend: one failed pod restarts its whole group. Pure.

The ranks of one engine cannot recover alone: when any pod of a group is deleted or fails (phase
Failed, or a container restarted), every other pod of the group is deleted too, so the StatefulSets
recreate the group from scratch. Pods the operator deletes for a restart are first marked with the
``RESTART_ANNOTATION`` (the uid of the pod that triggered it); events about marked pods are expected
and trigger nothing, so a restart never feeds itself. LeaderWorkerSets restart their groups
themselves (``RecreateGroupOnPodRestart``); their pods are left alone here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

RESTART_ANNOTATION = "nvidia.com/dynamo-group-restart-for"


def _doomed(pod: dict[str, Any]) -> bool:
    return RESTART_ANNOTATION in (pod.get("metadata", {}).get("annotations") or {})


def owned_by_statefulset(pod: dict[str, Any]) -> bool:
    refs = pod.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("kind") == "StatefulSet" and r.get("controller") for r in refs)


def owner_statefulset(pod: dict[str, Any]) -> str | None:
    refs = pod.get("metadata", {}).get("ownerReferences") or []
    return next((r["name"] for r in refs if r.get("kind") == "StatefulSet" and r.get("controller")), None)


def restart_trigger(pod: dict[str, Any], event_type: str | None, *, group_label: str) -> str | None:
    """Why this pod event must restart the pod's group (a CamelCase reason), or None."""
    meta = pod.get("metadata", {})
    if not (meta.get("labels") or {}).get(group_label) or not owned_by_statefulset(pod) or _doomed(pod):
        return None
    if event_type == "DELETED" or meta.get("deletionTimestamp"):
        return "PodDeleted"
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        return "PodFailed"
    for cs in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
        if (cs.get("restartCount") or 0) > 0:
            return "ContainerRestarted"
    return None


def pods_to_restart(group_pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods of the group to delete: every one not already terminating or marked for a restart."""
    return sorted(
        (p for p in group_pods if not p["metadata"].get("deletionTimestamp") and not _doomed(p)),
        key=lambda p: p["metadata"]["name"],
    )


def restart_mark(trigger_uid: str, pod_uid: str) -> dict[str, Any]:
    """The merge patch that marks pod ``pod_uid`` as deleted by the restart ``trigger_uid`` caused.
    The uid in the patch is a precondition: a newer pod of the same name is never marked."""
    return {"metadata": {"uid": pod_uid, "annotations": {RESTART_ANNOTATION: trigger_uid}}}
