"""Where a graph's pods go and how many must stay: gangs, topology packing, priority, disruption budgets.
Pure.

- **Gangs** (``config.gang_scheduler == "coscheduling"``): scheduler-plugins' coscheduling plugin binds
  the pods of a ``PodGroup`` (``scheduling.x-k8s.io/v1alpha1``) only once ``minMember`` of them fit, so a
  gang starts whole or not at all. A graph whose services set ``minAvailable`` (v1beta1) is one gang
  named after the graph: ``minAvailable`` replicas (groups, when multinode) of each such service. Every
  multinode group of a service without ``minAvailable`` is a gang of its own (its ``nodeCount`` pods).
  Gang pods carry the label ``scheduling.x-k8s.io/pod-group`` and ``schedulerName`` of the scheduler
  that runs the plugin. Without a gang scheduler, ``minAvailable`` is a ``GangSchedulerMissing`` warning.
- **Topology** (``topologyConstraint.packDomain``, graph and service level): a required pod affinity on
  the node label that names one such domain (``config.topology_domains``): every pod of the graph (graph
  level), of the service, or of one multinode group (service level, as Dynamo packs per replica) lands
  in one domain. The kube-scheduler places the first pod anywhere its own term allows.
- **Priority**: the graph's ``priorityClassName`` on every pod whose podTemplate sets none.
- **Disruption budgets**: a service with ``minAvailable`` gets a PodDisruptionBudget keeping that many
  replicas' pods (times ``nodeCount``) through voluntary disruptions (drains, evictions).
"""

from __future__ import annotations

import copy
from typing import Any, Final

from dynamo_api.components import Component
from dynamo_api.models import DynamoGraphDeployment

from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import labels
from dynamo_operator.render.names import child_name, label_value
from dynamo_operator.render.pods import object_meta
from dynamo_operator.render.types import Notice, Problem

__all__ = [
    "POD_GROUP_API_VERSION",
    "POD_GROUP_LABEL",
    "disruption_budgets",
    "gang",
    "graph_pod_group",
    "notices",
    "place",
    "pod_group",
    "problems",
]

POD_GROUP_API_VERSION: Final = "scheduling.x-k8s.io/v1alpha1"
POD_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"


def _min_available(dgd: DynamoGraphDeployment, c: Component) -> int | None:
    return dgd.v1beta1.service(c.name).min_available


def gang(dgd: DynamoGraphDeployment, c: Component, config: OperatorConfig, group: str | None) -> str | None:
    """The PodGroup the pods of ``c`` (of multinode ``group``) belong to; None: no gang."""
    if config.gang_scheduler == "none":
        return None
    if _min_available(dgd, c) is not None:
        return label_value(dgd.name)
    return group


def pod_group(dgd: DynamoGraphDeployment, c: Component | None, name: str, members: int) -> dict[str, Any]:
    return {
        "apiVersion": POD_GROUP_API_VERSION,
        "kind": "PodGroup",
        "metadata": object_meta(dgd, c, name),
        "spec": {"minMember": members},
    }


def graph_pod_group(
    dgd: DynamoGraphDeployment, comps: list[Component], config: OperatorConfig
) -> list[dict[str, Any]]:
    """The graph's gang: minAvailable replicas' pods of every service that sets minAvailable."""
    if config.gang_scheduler == "none":
        return []
    members = 0
    for c in comps:
        wanted = _min_available(dgd, c)
        if wanted is not None:
            members += min(wanted, c.spec.replicas) * c.spec.node_count
    return [pod_group(dgd, None, label_value(dgd.name), members)] if members else []


def _pack_term(selector: dict[str, str], topology_key: str) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": selector}, "topologyKey": topology_key}


def place(
    dgd: DynamoGraphDeployment,
    c: Component,
    config: OperatorConfig,
    spec: dict[str, Any],
    group: str | None = None,
) -> dict[str, Any]:
    """``spec`` (a pod spec) with the graph's priority class, the gang's scheduler and the pack-domain
    affinity of ``c`` (pods of multinode ``group``); what the podTemplate set itself wins."""
    out = copy.deepcopy(spec)
    if dgd.spec.priority_class_name and "priorityClassName" not in out:
        out["priorityClassName"] = dgd.spec.priority_class_name
    if gang(dgd, c, config, group) is not None:
        out.setdefault("schedulerName", config.gang_scheduler_name)
    terms = []
    graph_key = config.topology_domains.get(dgd.spec.pack_domain or "")
    if graph_key:
        terms.append(_pack_term({labels.GRAPH: label_value(dgd.name)}, graph_key))
    service_key = config.topology_domains.get(c.spec.pack_domain or "")
    if service_key:
        selector = {labels.GROUP: group} if group else labels.selector(dgd.name, c.name)
        terms.append(_pack_term(selector, service_key))
    if terms:
        affinity = out.setdefault("affinity", {}).setdefault("podAffinity", {})
        affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).extend(terms)
    return out


def disruption_budgets(dgd: DynamoGraphDeployment, comps: list[Component]) -> list[dict[str, Any]]:
    out = []
    for c in comps:
        wanted = _min_available(dgd, c)
        if wanted is None:
            continue
        out.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": object_meta(dgd, c, child_name(dgd.name, c.name)),
                "spec": {
                    "minAvailable": wanted * c.spec.node_count,
                    "selector": {"matchLabels": labels.selector(dgd.name, c.name)},
                },
            }
        )
    return out


def problems(dgd: DynamoGraphDeployment, comps: list[Component], config: OperatorConfig) -> list[Problem]:
    """Pack domains the operator has no node label for."""
    known = ", ".join(f"{k} ({v})" for k, v in sorted(config.topology_domains.items())) or "none"
    wanted = [("spec.topologyConstraint.packDomain", dgd.spec.pack_domain)]
    wanted += [(f"{c.path}.topologyConstraint.packDomain", c.spec.pack_domain) for c in comps]
    return [
        Problem(
            path,
            "UnknownPackDomain",
            f"packDomain {domain!r} names no node label this operator knows (known: {known}); use one of "
            f"them, or map it to the label your nodes carry with the operator's --topology-domains "
            f'(chart value runtime.topologyDomains, e.g. {{"{domain}": "example.com/{domain}"}}).',
        )
        for path, domain in wanted
        if domain is not None and domain not in config.topology_domains
    ]


def notices(dgd: DynamoGraphDeployment, comps: list[Component], config: OperatorConfig) -> list[Notice]:
    """Warnings for fields that do not reach the pods: minAvailable without a gang scheduler, the
    topologyProfile of a topologyConstraint (pack domains are node labels here), and the v1beta1 fields
    this operator accepts and does not act on."""
    out = []
    gangs = [c.name for c in comps if _min_available(dgd, c) is not None]
    if gangs and config.gang_scheduler == "none":
        out.append(
            Notice(
                "GangSchedulerMissing",
                f"{', '.join(gangs)} set minAvailable, which keeps a PodDisruptionBudget but cannot start "
                "them as one gang: no gang scheduler is configured. Install scheduler-plugins with its "
                "coscheduling plugin (the operator detects its PodGroup CRD at start-up) or remove "
                "minAvailable.",
                warning=True,
            )
        )
    ignored = [f"spec.{name}" for name in dgd.v1beta1.ignored]
    if (dgd.spec.topology_constraint or {}).get("topologyProfile"):
        ignored.append("spec.topologyConstraint.topologyProfile")
    for c in comps:
        ignored += [f"{c.name}.{name}" for name in dgd.v1beta1.service(c.name).ignored]
    if ignored:
        out.append(
            Notice(
                "IgnoredFields",
                f"This operator accepts and does not act on {', '.join(ignored)}: NVIDIA Dynamo's Grove, "
                "ClusterTopology, restart and experimental features have no counterpart here (pack domains "
                "are node labels: the operator's --topology-domains); remove them to clear this warning.",
                warning=True,
            )
        )
    return out
