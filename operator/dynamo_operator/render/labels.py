"""Labels the operator puts on every child and pod template, and the selectors built from them.

Every child (Deployment, StatefulSet, LeaderWorkerSet, Service, PVC) and every pod template carries
``MANAGED_BY``, ``GRAPH``, ``COMPONENT`` and ``COMPONENT_TYPE``. Pods of a multinode group also carry
``GROUP`` (the group's name) and ``MULTINODE_ROLE`` (leader or worker); their rank is the controller's
own label: ``POD_INDEX`` (StatefulSet) or ``LWS_WORKER_INDEX`` (LeaderWorkerSet).
"""

from __future__ import annotations

from typing import Final

from dynamo_operator.render.names import label_value

__all__ = [
    "COMPONENT",
    "COMPONENT_TYPE",
    "GRAPH",
    "GROUP",
    "LWS_WORKER_INDEX",
    "MANAGED_BY",
    "MANAGED_BY_VALUE",
    "MULTINODE_ROLE",
    "POD_INDEX",
    "child_labels",
    "graph_selector",
    "selector",
]

MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "dynamo-sglang-operator"
GRAPH: Final = "nvidia.com/dynamo-graph-deployment-name"
COMPONENT: Final = "nvidia.com/dynamo-component"
COMPONENT_TYPE: Final = "nvidia.com/dynamo-component-type"
GROUP: Final = "nvidia.com/dynamo-group"
MULTINODE_ROLE: Final = "nvidia.com/dynamo-multinode-role"  # leader | worker
POD_INDEX: Final = "apps.kubernetes.io/pod-index"  # set by the StatefulSet controller
LWS_WORKER_INDEX: Final = "leaderworkerset.sigs.k8s.io/worker-index"  # set by the LWS controller


def graph_selector(graph: str) -> dict[str, str]:
    """Selects every child the operator made for ``graph`` (for listing and pruning)."""
    return {MANAGED_BY: MANAGED_BY_VALUE, GRAPH: label_value(graph)}


def selector(graph: str, service: str) -> dict[str, str]:
    """The immutable pod selector of ``service``'s workloads."""
    return {GRAPH: label_value(graph), COMPONENT: service}


def child_labels(graph: str, service: str, component_type: str) -> dict[str, str]:
    return {
        MANAGED_BY: MANAGED_BY_VALUE,
        GRAPH: label_value(graph),
        COMPONENT: service,
        COMPONENT_TYPE: component_type,
    }
