"""Multinode group restarts for the StatefulSet backend (I/O around the pure rules of ``groups``).

When a pod of a group fails or is deleted, every other pod of the group is marked and deleted so the
StatefulSets recreate the whole group; a Warning Event ``GroupRestarted`` on the graph says which pod
caused it. Restarts of one group are serialized; the pods a restart touched never trigger another.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from dynamo_operator.reconcile.groups import owner_statefulset, pods_to_restart, restart_mark, restart_trigger
from dynamo_operator.reconcile.kube import (
    DGD,
    POD,
    STATEFULSET,
    Conflict,
    Kube,
    KubeError,
    NotFound,
    label_selector,
)
from dynamo_operator.render import labels

logger = logging.getLogger(__name__)

MAX_REMEMBERED = 4096


class GroupRestarter:
    def __init__(self, kube: Kube, owner_key: Callable[[Mapping[str, Any]], tuple[str, str] | None]) -> None:
        self.kube = kube
        self._owner_key = owner_key
        self._group_locks: dict[tuple[str, str], asyncio.Lock] = {}
        # uids of pods that already caused (or were deleted by) a group restart: their later events
        # (more MODIFIED, then DELETED) must not restart the group again. Bounded, oldest dropped.
        self._restart_seen: dict[str, None] = {}

    async def pod_event(self, event_type: str | None, pod: dict[str, Any]) -> None:
        reason = restart_trigger(pod, event_type, group_label=labels.GROUP)
        if reason is not None and pod["metadata"].get("uid") not in self._restart_seen:
            await self._restart_group(pod, reason, event_type)

    async def _restart_group(self, pod: dict[str, Any], reason: str, event_type: str | None) -> None:
        meta = pod["metadata"]
        namespace, trigger_uid = meta["namespace"], meta["uid"]
        group = meta["labels"][labels.GROUP]
        lock = self._group_locks.setdefault((namespace, group), asyncio.Lock())
        async with lock:
            if trigger_uid in self._restart_seen:
                return
            sts_name = owner_statefulset(pod)
            sts = await self.kube.get(STATEFULSET, namespace, sts_name) if sts_name else None
            if sts is None or sts["metadata"].get("deletionTimestamp"):
                return  # the group is being removed (scale down, graph deleted): nothing to restart
            owner = self._owner_key(sts)
            graph = await self.kube.get(DGD, namespace, owner[1]) if owner else None
            if graph is None or graph["metadata"].get("deletionTimestamp"):
                return
            selector = label_selector(
                {
                    labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
                    labels.GRAPH: meta["labels"][labels.GRAPH],
                    labels.GROUP: group,
                }
            )
            doomed = pods_to_restart(await self.kube.list(POD, namespace, selector))
            self._remember_restart(trigger_uid, *(p["metadata"]["uid"] for p in doomed))
            if event_type != "DELETED":  # mark the trigger too, so its later events are recognised
                await self._mark(namespace, meta["name"], trigger_uid, trigger_uid)
            deleted = 0
            for p in doomed:
                pname, puid = p["metadata"]["name"], p["metadata"]["uid"]
                if await self._mark(namespace, pname, puid, trigger_uid):
                    deleted += await self.kube.delete(POD, namespace, pname, uid=puid)
            if deleted == 0:
                logger.info("Group restart found no pod to delete group=%s trigger=%s", group, meta["name"])
                return
            message = (
                f"Restarted multinode group {group}: pod {meta['name']} {_REASON_TEXT.get(reason, reason)}; "
                f"deleted {deleted} pod(s) of the group so that all ranks start together"
            )
            logger.warning(
                "%s graph=%s/%s trigger_uid=%s event=%s deleted_uids=%s",
                message,
                namespace,
                graph["metadata"]["name"],
                trigger_uid,
                event_type,
                ",".join(p["metadata"]["uid"] for p in doomed),
            )
            await self.kube.post_event(graph, type_="Warning", reason="GroupRestarted", message=message)

    async def _mark(self, namespace: str, name: str, uid: str, trigger_uid: str) -> bool:
        """Mark pod ``name`` (only the incarnation ``uid``) as deleted by a restart; False if gone."""
        try:
            await self.kube.patch_merge(POD, namespace, name, restart_mark(trigger_uid, uid))
        except (NotFound, Conflict) as exc:  # gone, or a newer pod of that name (uid precondition)
            logger.debug("Pod not marked for restart pod=%s error=%s", name, exc)
            return False
        except KubeError as exc:  # e.g. 403: the operator's role lacks patch on pods
            logger.warning("Could not mark pod for a group restart pod=%s error=%s", name, exc)
            return False
        return True

    def _remember_restart(self, *uids: str) -> None:
        for uid in uids:
            self._restart_seen[uid] = None
        while len(self._restart_seen) > MAX_REMEMBERED:
            self._restart_seen.pop(next(iter(self._restart_seen)))


_REASON_TEXT = {
    "PodDeleted": "was deleted",
    "PodFailed": "failed",
    "ContainerRestarted": "had a container restart",
}
