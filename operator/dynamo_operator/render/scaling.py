"""Scaling adapters of a graph, and who sets each service's replicas. Pure.

A service with ``scalingAdapter: {enabled: true}`` (v1beta1: ``scalingAdapter: {}``) gets a
``DynamoGraphDeploymentScalingAdapter`` named like its workload (``<graph>-<service lowercased>``), owned
by the graph. From then on the adapter's ``spec.replicas`` is the service's replica count: HPA, KEDA
and ``kubectl scale`` write it through the ``scale`` subresource and the operator copies it into the
graph. The adapter is made with the service's replicas of that moment; the operator never writes its
``spec.replicas`` afterwards.

A planner component also sets replicas: those of the graph's prefill and decode services (only one
role with ``--scale prefill|decode``, or ``mode`` in an inline ``--config``). A service both scaled by a
planner and opted into an adapter would have two writers of one number, so the planner wins: that
service gets no adapter (an existing one is deleted) and a ``ScalingConflict`` says so (a condition
and an Event). The planner wins because it is part of the graph's own spec and balances prefill
against decode, and because the operator cannot stop it; the spec alone shows the conflict, so it is
refused before anything fights, whichever writer (HPA, KEDA, kubectl scale, a custom controller)
would have used the adapter.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dynamo_api import scaling
from dynamo_api.components import Component
from dynamo_api.models import DynamoGraphDeployment, ServiceSpec
from dynamo_api.sglang_args import flag_value

from dynamo_operator.render import labels
from dynamo_operator.render.names import child_name
from dynamo_operator.render.pods import object_meta
from dynamo_operator.render.types import ScalingConflict

__all__ = [
    "PLANNER_ROLES",
    "ScalingConflict",
    "adapter",
    "adapter_enabled",
    "planner_targets",
    "pod_selector",
    "scaling_adapters",
]

PLANNER_ROLES = ("prefill", "decode")  # what a planner scales without --scale


def adapter_enabled(spec: ServiceSpec) -> bool:
    return spec.scaling_adapter is not None and spec.scaling_adapter.enabled


def _scaled_roles(planner: Component) -> tuple[str, ...]:
    """The roles a planner scales: ``--scale``, else ``mode`` of an inline ``--config``, else both."""
    words = [*planner.command_view.get("command", []), *planner.command_view.get("args", [])]
    value = flag_value(words, "--scale")
    config = flag_value(words, "--config") or ""
    if value is None and config.lstrip().startswith("{"):
        try:
            value = json.loads(config).get("mode")
        except (ValueError, AttributeError):
            value = None
    return (value,) if value in PLANNER_ROLES else PLANNER_ROLES


def planner_targets(comps: Sequence[Component]) -> dict[str, str]:
    """Service name -> the name of the planner service that sets its replicas."""
    out: dict[str, str] = {}
    for planner in (c for c in comps if c.component_type == "planner"):
        roles = _scaled_roles(planner)
        for c in comps:
            if c.kind == "worker" and c.role in roles:
                out.setdefault(c.name, planner.name)
    return out


def pod_selector(graph: str, service: str) -> str:
    """The label selector (string form, as the scale subresource reports it) of ``service``'s pods."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.selector(graph, service).items()))


def adapter(dgd: DynamoGraphDeployment, c: Component) -> dict[str, Any]:
    """The adapter of service ``c`` as first made: ``spec.replicas`` is the service's replicas now."""
    meta = object_meta(dgd, c, child_name(dgd.name, c.name))
    meta.pop("annotations", None)
    return {
        "apiVersion": scaling.API_VERSION,
        "kind": scaling.KIND,
        "metadata": meta,
        "spec": {"replicas": c.spec.replicas, "dgdRef": {"name": dgd.name, "serviceName": c.name}},
    }


def scaling_adapters(
    dgd: DynamoGraphDeployment, comps: Sequence[Component]
) -> tuple[tuple[dict[str, Any], ...], tuple[ScalingConflict, ...]]:
    """The adapters ``dgd`` should have, and the services refused one because a planner scales them."""
    planned = planner_targets(comps)
    adapters, conflicts = [], []
    for c in comps:
        if not adapter_enabled(c.spec):
            continue
        if c.name in planned:
            conflicts.append(ScalingConflict(c.name, planned[c.name], child_name(dgd.name, c.name)))
        else:
            adapters.append(adapter(dgd, c))
    return tuple(adapters), tuple(conflicts)
