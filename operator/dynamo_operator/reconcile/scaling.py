"""What the operator writes around scaling adapters (``render.scaling``), decided from what it reads. Pure.

- :func:`replicas_to_copy`: the services whose adapter's ``spec.replicas`` (set by HPA, KEDA or
  ``kubectl scale``) differs from the graph's (:func:`replicas_asked`: of a graph's model, before it is
  rendered; :func:`with_replicas`: the model with them, what the visit renders); :func:`replicas_patch`
  writes them into the stored
  v1beta1 graph as a JSON patch (each index guarded by a test of the component's name), under the
  field manager :data:`FIELD_MANAGER`, so ``kubectl get dgd --show-managed-fields`` says who set them.
- :func:`adapter_drift`: a merge patch restoring an adapter's labels and ``dgdRef`` (never its
  ``spec.replicas``).
- :func:`adapter_status`: ``status.replicas`` (the service's replicas that exist) and ``status.selector``
  (its pods' label selector), which the ``scale`` subresource reports to HPA.
- :func:`conflict_condition`: the ``ScalingConflict`` condition of the graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dynamo_api.components import components
from dynamo_api.models import DynamoGraphDeployment

from dynamo_operator.reconcile.apply_rules import controlled_by
from dynamo_operator.reconcile.conditions import Cond
from dynamo_operator.render.scaling import scaling_adapters
from dynamo_operator.render.types import ScalingConflict

__all__ = [
    "FIELD_MANAGER",
    "SCALING_CONFLICT",
    "adapter_drift",
    "adapter_status",
    "conflict_condition",
    "replicas_asked",
    "replicas_patch",
    "replicas_to_copy",
    "with_replicas",
]

FIELD_MANAGER = "dynamo-scaling-adapter"
SCALING_CONFLICT = "ScalingConflict"


def replicas_to_copy(
    observed: Sequence[dict[str, Any]],
    desired: Sequence[dict[str, Any]],
    replicas: Mapping[str, int],
    owner_uid: str,
) -> dict[str, int]:
    """Service -> replicas, for each desired adapter of this graph whose ``spec.replicas`` differs from
    the service's ``replicas``."""
    wanted = {a["metadata"]["name"]: a["spec"]["dgdRef"]["serviceName"] for a in desired}
    out: dict[str, int] = {}
    for obj in observed:
        service = wanted.get(obj["metadata"]["name"])
        spec = obj.get("spec") or {}
        if service is None or not controlled_by(obj, owner_uid):
            continue
        if (spec.get("dgdRef") or {}).get("serviceName") != service:
            continue  # edited to point elsewhere: restored by adapter_drift, copied on the next visit
        value = spec.get("replicas")
        if isinstance(value, int) and value != replicas.get(service):
            out[service] = value
    return out


def replicas_asked(dgd: DynamoGraphDeployment, observed: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Service -> replicas, for each service of ``dgd`` whose adapter (among ``observed``) asks for other
    replicas than the graph's."""
    desired, _ = scaling_adapters(dgd, components(dgd))
    current = {name: spec.replicas for name, spec in dgd.spec.services.items()}
    return replicas_to_copy(observed, desired, current, dgd.metadata.uid or "")


def with_replicas(dgd: DynamoGraphDeployment, changes: Mapping[str, int]) -> DynamoGraphDeployment:
    """``dgd`` with the replicas of ``changes`` (service -> replicas), as it reads once they are copied."""
    if not changes:
        return dgd
    services = {
        name: spec.model_copy(update={"replicas": changes[name]}) if name in changes else spec
        for name, spec in dgd.spec.services.items()
    }
    return dgd.model_copy(update={"spec": dgd.spec.model_copy(update={"services": services})})


def replicas_patch(graph: dict[str, Any], changes: Mapping[str, int]) -> list[dict[str, Any]]:
    """RFC 6902 operations setting ``spec.components[name].replicas`` of the stored (v1beta1) ``graph``."""
    ops: list[dict[str, Any]] = []
    for i, comp in enumerate((graph.get("spec") or {}).get("components") or []):
        name = comp.get("name")
        if name in changes:
            ops.append({"op": "test", "path": f"/spec/components/{i}/name", "value": name})
            ops.append({"op": "add", "path": f"/spec/components/{i}/replicas", "value": changes[name]})
    return ops


def adapter_drift(desired: dict[str, Any], observed: dict[str, Any]) -> dict[str, Any] | None:
    """The merge patch that restores ``desired``'s labels and ``dgdRef`` on ``observed`` (None: none)."""
    patch: dict[str, Any] = {}
    want_labels = desired["metadata"].get("labels") or {}
    have_labels = observed["metadata"].get("labels") or {}
    if any(have_labels.get(k) != v for k, v in want_labels.items()):
        patch["metadata"] = {"labels": want_labels}
    if (observed.get("spec") or {}).get("dgdRef") != desired["spec"]["dgdRef"]:
        patch["spec"] = {"dgdRef": desired["spec"]["dgdRef"]}
    return patch or None


def adapter_status(
    observed: dict[str, Any], replicas: int, selector: str, scaled_at: str | None
) -> dict[str, Any] | None:
    """The status merge patch of an adapter (None when its status already says this)."""
    new: dict[str, Any] = {"replicas": replicas, "selector": selector}
    if scaled_at is not None:
        new["lastScaleTime"] = scaled_at
    current = observed.get("status") or {}
    if all(current.get(k) == v for k, v in new.items()):
        return None
    return {"status": new}


def conflict_condition(
    conflicts: Sequence[ScalingConflict], adapters: Sequence[dict[str, Any]]
) -> Cond | None:
    """``ScalingConflict``: True naming each refused service and the fix; False when every opted-in
    service has its adapter; None when no service opts in."""
    if conflicts:
        parts = [
            f"service {c.service} sets scalingAdapter but planner {c.planner} scales it, so the planner "
            f"keeps its replicas and there is no DynamoGraphDeploymentScalingAdapter {c.adapter} (an HPA, "
            "KEDA or kubectl scale aimed at it finds nothing)"
            for c in conflicts
        ]
        fix = (
            "Fix: remove scalingAdapter from the service to let the planner scale it, or remove the planner "
            "(or run it with --scale for the other role) to scale the service from outside"
        )
        return Cond(SCALING_CONFLICT, "True", "PlannerScalesService", "; ".join(parts) + ". " + fix + ".")
    if adapters:
        names = ", ".join(a["metadata"]["name"] for a in adapters)
        return Cond(
            SCALING_CONFLICT, "False", "NoConflict", f"Replicas come from the scaling adapters {names}"
        )
    return None
