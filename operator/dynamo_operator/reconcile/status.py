"""Status of a graph from its OBSERVED children (never from what was desired). Pure.

Per service: ``replicas`` (the pods that exist, old ones of a rollout included, or the groups of
multinode services), ``readyReplicas`` and ``updatedReplicas``. A multinode group counts as ready
only when every workload object of the group (LeaderWorkerSet, or the group's StatefulSets) has
all its pods ready at its current generation; the graph is Ready only when every service has as
many ready and updated replicas as the spec asks for, and no extra ones (old pods of a rollout or
a scale-down still count as extra).

When a graph is not Ready, the pods' own status says why when they are stuck: the scheduler's
``Unschedulable`` message (e.g. ``0/2 nodes are available: 2 Insufficient nvidia.com/gpu``) or a
container waiting on a reason that does not resolve by itself (image pull errors, crash loops, a
missing Secret). The first stuck pod of each service is named in the Ready message, bounded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from dynamo_operator.reconcile.conditions import READY, Cond

WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "LeaderWorkerSet"})

STATE_PENDING = "pending"
STATE_SUCCESSFUL = "successful"
STATE_FAILED = "failed"


# Read-only members (properties), so that render's frozen dataclasses, whose ``kind`` is a Literal,
# satisfy them.
class WorkloadLike(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...


class GroupLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def workloads(self) -> tuple[WorkloadLike, ...]: ...


class PlanLike(Protocol):
    """What status needs from a render ``ServicePlan``: the structure, never the counts to report."""

    @property
    def kind(self) -> str: ...
    @property
    def replicas(self) -> int: ...
    @property
    def nodes_per_replica(self) -> int: ...
    @property
    def children(self) -> tuple[str, ...]: ...
    @property
    def groups(self) -> tuple[GroupLike, ...]: ...


@dataclass(frozen=True)
class ServiceCounts:
    kind: str
    replicas: int
    ready: int
    updated: int
    desired: int
    names: tuple[str, ...] = field(default=())

    @property
    def is_ready(self) -> bool:
        return self.replicas == self.desired and self.ready == self.desired and self.updated == self.desired

    def as_status(self) -> dict[str, Any]:
        status = {
            "componentKind": self.kind,
            "replicas": self.replicas,
            "readyReplicas": self.ready,
            "updatedReplicas": self.updated,
        }
        if self.names:
            status["componentName"] = self.names[0]
            if len(self.names) > 1:
                status["componentNames"] = list(self.names)
        return status


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _current(obj: dict[str, Any]) -> bool:
    """The child's controller has seen its latest spec (observedGeneration caught up)."""
    observed = obj.get("status", {}).get("observedGeneration")
    generation = obj.get("metadata", {}).get("generation")
    return observed is None if generation is None else _int(observed) >= generation


def workload_counts(obj: dict[str, Any]) -> tuple[int, int, int, int]:
    """(desired, existing, ready, updated) pods (or LWS groups) of one workload object, as observed.

    ``existing`` counts every pod the controller reports, old template included: during a rolling
    update or a scale-down it exceeds ``desired``, and the old pods may be the ready ones."""
    spec_replicas = obj.get("spec", {}).get("replicas", 1)
    status = obj.get("status", {}) or {}
    existing = _int(status.get("replicas"))
    if not _current(obj):
        return _int(spec_replicas), existing, 0, 0
    return (
        _int(spec_replicas),
        existing,
        _int(status.get("readyReplicas")),
        _int(status.get("updatedReplicas")),
    )


def _workload_state(obj: dict[str, Any] | None) -> tuple[bool, bool]:
    """(all pods ready, all pods updated) of one observed workload; a missing one is neither, and
    neither is one that still has pods beyond those it wants (a rollout or scale-down in progress)."""
    if obj is None:
        return False, False
    desired, existing, ready, updated = workload_counts(obj)
    settled = existing <= desired
    return settled and ready >= desired, settled and updated >= desired


def service_counts(
    name: str,
    plan: PlanLike,
    children: Iterable[dict[str, Any]],
    *,
    component_label: str,
    group_label: str,
) -> ServiceCounts:
    """Aggregate the observed workload children of one service, using the plan only for structure
    (which objects belong to which group)."""
    mine = {
        c["metadata"]["name"]: c
        for c in children
        if c.get("kind") == plan.kind
        and (c.get("metadata", {}).get("labels") or {}).get(component_label) == name
    }
    names = tuple(sorted(mine))
    if plan.groups:
        replicas = len({(c["metadata"].get("labels") or {}).get(group_label) or n for n, c in mine.items()})
        ready = updated = 0
        for group in plan.groups:
            states = [_workload_state(mine.get(w.name)) for w in group.workloads]
            ready += all(r for r, _ in states)
            updated += all(u for _, u in states)
        return ServiceCounts(plan.kind, replicas, ready, updated, plan.replicas, names)
    replicas = ready = updated = 0
    for c in mine.values():
        desired, existing, r, u = workload_counts(c)
        replicas += existing
        ready += min(r, desired)
        updated += min(u, desired)
    return ServiceCounts(plan.kind, replicas, ready, updated, plan.replicas, names)


def all_counts(
    plans: Mapping[str, PlanLike],
    children: Iterable[dict[str, Any]],
    *,
    component_label: str,
    group_label: str,
) -> dict[str, ServiceCounts]:
    children = list(children)
    return {
        name: service_counts(name, plan, children, component_label=component_label, group_label=group_label)
        for name, plan in sorted(plans.items())
    }


# Container waiting reasons that do not go away by waiting: the pod needs a fix (the image, the
# command, a Secret or ConfigMap), each with the hint that names the fix.
STUCK_WAITING = {
    "ErrImagePull": "check the image name and tag and the imagePullSecrets",
    "ImagePullBackOff": "check the image name and tag and the imagePullSecrets",
    "InvalidImageName": "fix the image name",
    "CrashLoopBackOff": "see `kubectl logs --previous` of the pod",
    "CreateContainerConfigError": "create the missing Secret or ConfigMap, or fix the reference",
    "CreateContainerError": "fix the container's command or mounts",
    "RunContainerError": "fix the container's command or mounts",
}
UNSCHEDULABLE = ("PodScheduled", "False", "Unschedulable")  # (type, status, reason) of the condition
UNSCHEDULABLE_HINT = "lower the service's resources or add nodes that can hold the pod"
MAX_POD_MESSAGE = 200


def _bounded(reason: str, message: str | None) -> str:
    """``reason: message`` on one line, the message cut to ``MAX_POD_MESSAGE`` characters."""
    text = " ".join((message or "").split())
    if len(text) > MAX_POD_MESSAGE:
        text = text[: MAX_POD_MESSAGE - 3].rstrip() + "..."
    return f"{reason}: {text}" if text else reason


def pod_problem(pod: dict[str, Any]) -> str | None:
    """Why this pod is stuck, as its status states it (bounded, with the fix), or None when it is
    not stuck (starting, running, or being deleted)."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    name = meta.get("name", "?")
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == UNSCHEDULABLE:
            return f"pod {name} is {_bounded('Unschedulable', cond.get('message'))} ({UNSCHEDULABLE_HINT})"
    if status.get("phase") == "Failed":
        return f"pod {name} failed: {_bounded(status.get('reason') or 'Failed', status.get('message'))}"
    containers = (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
    for cs in containers:
        container = cs.get("name", "?")
        last = (cs.get("lastState") or {}).get("terminated") or {}
        if last.get("reason") == "OOMKilled" and not cs.get("ready"):
            restarts = cs.get("restartCount", 0)
            return (
                f"pod {name} container {container} was OOMKilled at its memory limit (restarted {restarts} "
                f"times; raise the service's resources.limits.memory)"
            )
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in STUCK_WAITING:
            detail = _bounded(reason, waiting.get("message"))
            return f"pod {name} container {container} is waiting: {detail} ({STUCK_WAITING[reason]})"
    return None


def pod_problems(pods: Iterable[dict[str, Any]], *, component_label: str) -> dict[str, str]:
    """Per service, the problem of its first stuck pod (by name, so the message is stable)."""
    result: dict[str, str] = {}
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name", "")):
        service = ((pod.get("metadata") or {}).get("labels") or {}).get(component_label)
        if service and service not in result:
            problem = pod_problem(pod)
            if problem is not None:
                result[service] = problem
    return result


def ready_condition(
    counts: Mapping[str, ServiceCounts], pod_selector: str = "", problems: Mapping[str, str] | None = None
) -> Cond:
    """Ready=True when every service is ready; otherwise a message naming what is missing, why when a
    pod of the service is stuck (``problems``, from :func:`pod_problems`), and the
    ``kubectl get pods -l <pod_selector>`` that shows more."""
    problems = problems or {}
    waiting = [
        f"{name} {c.ready}/{c.desired} {'groups' if c.kind != 'Deployment' else 'replicas'} ready"
        + (f" ({c.replicas} exist)" if c.replicas != c.desired else "")
        + (f", {problems[name]}" if name in problems else "")
        for name, c in counts.items()
        if not c.is_ready
    ]
    if not waiting:
        return Cond(READY, "True", "AllServicesReady", f"All {len(counts)} services are ready")
    where = f"`kubectl get pods -l {pod_selector}`" if pod_selector else "the graph's pods"
    return Cond(
        READY,
        "False",
        "ServicesNotReady",
        "Waiting for " + "; ".join(waiting) + f"; see {where} and the Events of the pods for why they "
        "are not ready",
    )


def services_status(counts: Mapping[str, ServiceCounts]) -> dict[str, dict[str, Any]]:
    return {name: c.as_status() for name, c in counts.items()}


def status_patch(current: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """The merge patch that turns ``current`` status into ``new`` (None when equal); services that
    disappeared are removed explicitly (merge patch keeps absent map keys)."""
    if all(current.get(k) == v for k, v in new.items()):
        return None
    patch = dict(new)
    gone = set(current.get("services") or {}) - set(new.get("services") or {})
    if gone:
        patch["services"] = {**(new.get("services") or {}), **dict.fromkeys(gone)}
    return {"status": patch}
