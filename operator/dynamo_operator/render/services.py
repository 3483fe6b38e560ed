"""Render one service: frontend (Deployment + Service), single-node worker or generic (Deployment),
multinode worker (groups of pods: LeaderWorkerSet, or StatefulSets + a headless Service)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from dynamo_api import contract
from dynamo_api.components import Component
from dynamo_api.models import DynamoGraphDeployment

from dynamo_operator.backends import nixl, sglang
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import labels, placement, workloads
from dynamo_operator.render.names import child_name, group_name, service_dns_name
from dynamo_operator.render.pods import pod_spec, template
from dynamo_operator.render.revision import PAIRED_CONDITION, REVISION_LABEL
from dynamo_operator.render.types import GroupPlan, ServicePlan, Workload

__all__ = ["ServiceOutput", "render_service"]


@dataclass(frozen=True)
class ServiceOutput:
    objects: list[dict[str, Any]]
    plan: ServicePlan


def _paired(spec: dict[str, Any], revision: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """A prefill or decode pod spec of revision ``revision`` with its readiness gate, and its label
    (``render.revision``); unchanged without a revision."""
    if revision is None:
        return spec, {}
    gates = [g for g in spec.get("readinessGates", []) if g.get("conditionType") != PAIRED_CONDITION]
    gated = {**spec, "readinessGates": [*gates, {"conditionType": PAIRED_CONDITION}]}
    return gated, {REVISION_LABEL: revision}


def _transport(rdma: nixl.RdmaSettings | None, c: Component) -> str | None:
    if c.kind != "worker":
        return None
    return "rdma" if rdma is not None else "tcp"


def _single(
    dgd: DynamoGraphDeployment,
    c: Component,
    config: OperatorConfig,
    container: dict[str, Any],
    rdma: nixl.RdmaSettings | None,
    revision: str | None,
) -> ServiceOutput:
    name = child_name(dgd.name, c.name)
    placed = placement.place(dgd, c, config, pod_spec(dgd, c, config, container, rdma))
    spec, paired = _paired(placed, revision)
    pod = template(dgd, c, spec, {**_gang_label(dgd, c, config, None), **paired})
    objects = [workloads.deployment(dgd, c, name, c.spec.replicas, pod)]
    services: tuple[str, ...] = ()
    if c.kind == "frontend":
        objects.insert(0, workloads.service(dgd, c, name))
        services = (name,)
    plan = ServicePlan(
        component_type=c.component_type,
        role=c.role,
        kind="Deployment",
        replicas=c.spec.replicas,
        nodes_per_replica=1,
        children=(name,),
        services=services,
        transport=_transport(rdma, c),  # type: ignore[arg-type]
    )
    return ServiceOutput(objects, plan)


def _gang_label(
    dgd: DynamoGraphDeployment, c: Component, config: OperatorConfig, group: str | None
) -> dict[str, str]:
    gang = placement.gang(dgd, c, config, group)
    return {placement.POD_GROUP_LABEL: gang} if gang else {}


def _with_env(container: dict[str, Any], env: list[dict[str, Any]]) -> dict[str, Any]:
    out = copy.deepcopy(container)
    names = {item["name"] for item in env}
    out["env"] = [item for item in out.get("env", []) if item["name"] not in names] + env
    return out


def _member(
    container: dict[str, Any], *, nnodes: int, leader_host: str, leader: bool, rank_label: str
) -> dict[str, Any]:
    rank: dict[str, Any] = (
        {"name": contract.ENV_NODE_RANK, "value": "0"}
        if leader
        else {
            "name": contract.ENV_NODE_RANK,
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{rank_label}']"}},
        }
    )
    env = [
        rank,
        {"name": contract.ENV_NUM_NODES, "value": str(nnodes)},
        {"name": contract.ENV_LEADER_HOST, "value": leader_host},
        # the other ranks' lifeline to the leader (dynamo_worker.runtime.group)
        {"name": contract.ENV_LEADER_SYSTEM_ADDR, "value": f"{leader_host}:{contract.SYSTEM_PORT}"},
    ]
    out = sglang.for_group_member(
        _with_env(container, env), nnodes=nnodes, leader_host=leader_host, leader=leader
    )
    if leader:  # the group's rendezvous listens on the leader: declared, like every port a pod serves
        dist_init = {"name": "dist-init", "containerPort": contract.DIST_INIT_PORT, "protocol": "TCP"}
        out["ports"] = [*out.get("ports", []), dist_init]
    return out


def _groups(
    dgd: DynamoGraphDeployment,
    c: Component,
    config: OperatorConfig,
    container: dict[str, Any],
    rdma: nixl.RdmaSettings | None,
    revision: str | None,
) -> ServiceOutput:
    nnodes = c.spec.node_count
    lws = config.group_backend == "lws"
    objects: list[dict[str, Any]] = []
    groups: list[GroupPlan] = []
    for index in range(c.spec.replicas):
        group = group_name(dgd.name, c.name, index, reserve=0 if lws else 2)
        leader_host = service_dns_name(f"{group}-0", group, dgd.namespace)
        rank_label = labels.LWS_WORKER_INDEX if lws else labels.POD_INDEX
        templates = {}
        gang = placement.gang(dgd, c, config, group)
        if gang == group:  # a gang of its own (not the graph's): one PodGroup per group
            objects.append(placement.pod_group(dgd, c, group, nnodes))
        for role, leader in (("leader", True), ("worker", False)):
            member = _member(
                container, nnodes=nnodes, leader_host=leader_host, leader=leader, rank_label=rank_label
            )
            placed = placement.place(dgd, c, config, pod_spec(dgd, c, config, member, rdma), group)
            spec, paired = _paired(placed, revision)
            member_labels = _gang_label(dgd, c, config, group)
            extra = {labels.GROUP: group, labels.MULTINODE_ROLE: role, **member_labels, **paired}
            templates[role] = template(dgd, c, spec, extra)
        if lws:
            objects.append(
                workloads.leader_worker_set(
                    dgd,
                    c,
                    group,
                    size=nnodes,
                    leader_template=templates["leader"],
                    worker_template=templates["worker"],
                )
            )
            groups.append(GroupPlan(group, leader_host, (Workload("LeaderWorkerSet", group, nnodes),)))
            continue
        workers = f"{group}-w"
        objects.append(workloads.headless_service(dgd, c, group, group))
        for name, role, pods, first in ((group, "leader", 1, 0), (workers, "worker", nnodes - 1, 1)):
            objects.append(
                workloads.stateful_set(
                    dgd,
                    c,
                    name,
                    group=group,
                    role=role,
                    pods=pods,
                    first_ordinal=first,
                    template=templates[role],
                )
            )
        groups.append(
            GroupPlan(
                group,
                leader_host,
                (Workload("StatefulSet", group, 1), Workload("StatefulSet", workers, nnodes - 1)),
                headless_service=group,
            )
        )
    plan = ServicePlan(
        component_type=c.component_type,
        role=c.role,
        kind="LeaderWorkerSet" if lws else "StatefulSet",
        replicas=c.spec.replicas,
        nodes_per_replica=nnodes,
        children=tuple(w.name for g in groups for w in g.workloads),
        groups=tuple(groups),
        services=tuple(g.headless_service for g in groups if g.headless_service),
        transport=_transport(rdma, c),  # type: ignore[arg-type]
    )
    return ServiceOutput(objects, plan)


def render_service(
    dgd: DynamoGraphDeployment,
    c: Component,
    config: OperatorConfig,
    container: dict[str, Any],
    rdma: nixl.RdmaSettings | None,
    revision: str | None = None,
) -> ServiceOutput:
    """``revision``: the graph's prefill/decode revision, for those two roles (``render.revision``)."""
    paired = revision if c.kind == "worker" and c.role in ("prefill", "decode") else None
    if c.kind == "worker" and c.spec.node_count > 1:
        return _groups(dgd, c, config, container, rdma, paired)
    return _single(dgd, c, config, container, rdma, paired)
