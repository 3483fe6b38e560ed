"""A graph's endpoint picker (componentType ``epp``) for a Gateway API gateway: its Service, the frontends'
headless Services and the GAIE ``InferencePool``. Pure.

NVIDIA Dynamo's shape: one service of the graph has ``componentType: epp``; its pods run
``python3 -m dynamo_worker.epp`` (``modules.EPP_MODULE``, rendered like any service by
``render.services``: a Deployment, ports ``grpc`` 9002 and ``system`` 9090, the env contract plus
``DYN_EPP_FRONTENDS``), and every frontend of the graph runs ``--router-mode direct``
(``render.pods``). Beside them this module renders:

- the picker's Service ``<graph>-<service>`` (ClusterIP: gRPC ext_proc and health, h2c; metrics);
- per frontend a headless Service ``<graph>-<frontend>-pods`` naming every ready frontend pod, which
  the picker resolves (its ``--frontends``);
- ``InferencePool`` ``<graph>-pool`` (``inference.networking.k8s.io/v1``, the name Dynamo's operator
  gives it): ``selector.matchLabels`` the graph's frontend pods, ``targetPorts`` the frontend port,
  ``endpointPickerRef`` the picker's Service and gRPC port. An ``HTTPRoute``'s backendRef names it.

The pool's CRD is GAIE's, not ours: where it is not installed the reconciler drops the pool with
:func:`without_pools` (the graph still serves through its frontends' Service) and says so once.
Field names: GAIE's v1 CRD (config/crd/bases/inference.networking.k8s.io_inferencepools.yaml).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from dynamo_api import contract
from dynamo_api.components import Component
from dynamo_api.models import DynamoGraphDeployment

from dynamo_operator.render import labels
from dynamo_operator.render.names import child_name, fit, frontend_pods_service, label_value
from dynamo_operator.render.pods import object_meta
from dynamo_operator.render.types import Notice, Rendered

__all__ = [
    "INFERENCE_POOL_API_VERSION",
    "INFERENCE_POOL_CRD",
    "INFERENCE_POOL_KIND",
    "picker_objects",
    "pool_name",
    "wants_pool",
    "without_pools",
]

INFERENCE_POOL_API_VERSION: Final = "inference.networking.k8s.io/v1"
INFERENCE_POOL_KIND: Final = "InferencePool"
INFERENCE_POOL_CRD: Final = "inferencepools.inference.networking.k8s.io"
GAIE_VERSION: Final = "v1.6.0"  # the CRD the chart vendors (inferenceExtension.installCRD)
_H2C: Final = "kubernetes.io/h2c"  # gRPC without TLS: what the gateway speaks to the picker


def pool_name(graph: str) -> str:
    return fit(f"{graph}-pool", 253)


def _service(dgd: DynamoGraphDeployment, c: Component) -> dict[str, Any]:
    name = child_name(dgd.name, c.name)
    ports = [
        {
            "name": contract.EPP_PORT_NAME,
            "port": contract.EPP_PORT,
            "targetPort": contract.EPP_PORT_NAME,
            "protocol": "TCP",
            "appProtocol": _H2C,
        },
        {"name": "system", "port": contract.SYSTEM_PORT, "targetPort": "system", "protocol": "TCP"},
    ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(dgd, c, name),
        "spec": {"type": "ClusterIP", "selector": labels.selector(dgd.name, c.name), "ports": ports},
    }


def _frontend_pods(dgd: DynamoGraphDeployment, frontend: Component) -> dict[str, Any]:
    port = {"name": "http", "port": contract.FRONTEND_PORT, "targetPort": "http", "protocol": "TCP"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(dgd, frontend, frontend_pods_service(dgd.name, frontend.name)),
        "spec": {
            "clusterIP": "None",
            "selector": labels.selector(dgd.name, frontend.name),
            "ports": [port],
        },
    }


def _pool(dgd: DynamoGraphDeployment, picker: Component) -> dict[str, Any]:
    return {
        "apiVersion": INFERENCE_POOL_API_VERSION,
        "kind": INFERENCE_POOL_KIND,
        "metadata": object_meta(dgd, picker, pool_name(dgd.name)),
        "spec": {
            "selector": {
                "matchLabels": {labels.GRAPH: label_value(dgd.name), labels.COMPONENT_TYPE: "frontend"}
            },
            "targetPorts": [{"number": contract.FRONTEND_PORT}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": child_name(dgd.name, picker.name),
                "port": {"number": contract.EPP_PORT},
                "failureMode": "FailClose",
            },
        },
    }


def picker_objects(dgd: DynamoGraphDeployment, comps: list[Component]) -> list[dict[str, Any]]:
    """The picker's Service, the frontends' headless Services and the InferencePool (none without a
    picker; validation allows one per graph)."""
    pickers = [c for c in comps if c.kind == "epp"]
    if not pickers:
        return []
    frontends = [_frontend_pods(dgd, f) for f in comps if f.kind == "frontend"]
    return [_service(dgd, pickers[0]), *frontends, _pool(dgd, pickers[0])]


def wants_pool(rendered: Rendered) -> bool:
    return any(o["kind"] == INFERENCE_POOL_KIND for o in rendered.objects)


def without_pools(rendered: Rendered) -> Rendered:
    """``rendered`` without its InferencePool, for a cluster without GAIE's CRD, and a warning (in
    SpecWarnings, an Event once) naming the fix."""
    pools = [o["metadata"]["name"] for o in rendered.objects if o["kind"] == INFERENCE_POOL_KIND]
    if not pools:
        return rendered
    notice = Notice(
        "InferencePoolCrdMissing",
        f"InferencePool {', '.join(pools)} was not created: this cluster has no CRD {INFERENCE_POOL_CRD} "
        "(the Gateway API Inference Extension's). The endpoint picker and the frontends run, but no "
        "gateway routes to them until it is installed: install the operator's chart with "
        "inferenceExtension.installCRD=true, or GAIE's own CRDs (kubectl apply -f https://github.com/"
        f"kubernetes-sigs/gateway-api-inference-extension/releases/download/{GAIE_VERSION}/manifests.yaml); "
        "the operator then creates the pool.",
        warning=True,
    )
    return dataclasses.replace(
        rendered,
        objects=tuple(o for o in rendered.objects if o["kind"] != INFERENCE_POOL_KIND),
        notices=(*rendered.notices, notice),
    )
