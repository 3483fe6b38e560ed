"""What ``render`` returns: the desired objects, or the problems that stop it, plus notices and plans."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from dynamo_api.validation import Problem  # defined in the base (dynamo-run reports it too)

__all__ = ["GroupPlan", "Notice", "Problem", "Rendered", "ScalingConflict", "ServicePlan", "Workload"]

WorkloadKind = Literal["Deployment", "StatefulSet", "LeaderWorkerSet"]


@dataclass(frozen=True)
class Notice:
    """A statement or warning to surface as a condition/Event; rendering goes on."""

    reason: str
    message: str
    service: str | None = None
    warning: bool = False


@dataclass(frozen=True)
class ScalingConflict:
    """Service ``service`` opts into a scaling adapter, but planner service ``planner`` scales it."""

    service: str
    planner: str
    adapter: str  # the adapter's name (not made)


@dataclass(frozen=True)
class Workload:
    """One workload object and the pods it should have ready."""

    kind: WorkloadKind
    name: str
    pods: int


@dataclass(frozen=True)
class GroupPlan:
    """One multinode group (one engine over ``len(pods)`` pods): ready when every workload is.

    With LeaderWorkerSet: one LeaderWorkerSet (``pods`` = group size, ready when its
    ``status.readyReplicas`` is 1). With StatefulSet: a leader StatefulSet (1 pod, ordinal 0) and a
    worker StatefulSet (N-1 pods, ordinals 1..N-1), ready when each has ``readyReplicas == pods``.
    """

    name: str
    leader_host: str
    workloads: tuple[Workload, ...]
    headless_service: str | None = None


@dataclass(frozen=True)
class ServicePlan:
    """What one entry of ``spec.services`` became.

    ``replicas`` is the desired pods for a Deployment and the desired groups for multinode services;
    ``children`` names every workload object of ``kind`` (for groups: all groups' workloads in order);
    ``services`` names the Kubernetes Services made for it.
    """

    component_type: str
    role: Literal["agg", "prefill", "decode", "encode", "diffusion"] | None
    kind: WorkloadKind
    replicas: int
    nodes_per_replica: int
    children: tuple[str, ...]
    groups: tuple[GroupPlan, ...] = ()
    services: tuple[str, ...] = ()
    transport: Literal["rdma", "tcp"] | None = None


@dataclass(frozen=True)
class Rendered:
    """The desired state of one graph. When ``problems`` is non-empty, ``objects`` is empty.

    ``adapters`` are the graph's DynamoGraphDeploymentScalingAdapters as first made (their
    ``spec.replicas`` belongs to HPA, KEDA or kubectl scale afterwards, so they are created, never
    applied); ``scaling_conflicts`` names the services refused one (``render.scaling``)."""

    objects: tuple[dict[str, Any], ...] = ()
    problems: tuple[Problem, ...] = ()
    notices: tuple[Notice, ...] = ()
    services: Mapping[str, ServicePlan] = field(default_factory=dict)
    adapters: tuple[dict[str, Any], ...] = ()
    scaling_conflicts: tuple[ScalingConflict, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems
