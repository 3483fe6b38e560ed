"""The I/O around a graph's scaling adapters (``render.scaling``), one visit at a time; the rules are the
pure ones of :mod:`dynamo_operator.reconcile.scaling`.

- :func:`copy_replicas`: the replicas the adapters ask for (``kubectl scale``, HPA, KEDA;
  ``scaling.replicas_asked``, decided before the visit renders) are written into the graph;
- :func:`sync`: missing adapters are created with the service's replicas, their labels and ``dgdRef``
  restored, their status written (the service's replicas that exist, its pods' selector), and adapters no
  longer desired deleted. An adapter's ``spec.replicas`` is never written here. What keeps an adapter
  from existing (no CRD on the API server, its name taken) comes back as warnings for the graph's
  ``SpecWarnings`` condition, so it is said once per change, not once per visit.

Both return what they changed (``outcome.Change``); the visit posts the Events (``outcome.events_for``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dynamo_operator.reconcile import apply_rules, scaling, status
from dynamo_operator.reconcile.kube import (
    DGD,
    SCALING_ADAPTER,
    Conflict,
    Kube,
    NotFound,
    label_selector,
    timestamp,
)
from dynamo_operator.reconcile.outcome import Change
from dynamo_operator.render import labels
from dynamo_operator.render.scaling import pod_selector
from dynamo_operator.render.types import Notice, Rendered

__all__ = ["CRD_MISSING", "NAME_TAKEN", "copy_replicas", "list_adapters", "sync"]

logger = logging.getLogger(__name__)
KIND = "DynamoGraphDeploymentScalingAdapter"
CRD_MISSING = "ScalingAdapterCRDMissing"
NAME_TAKEN = "ScalingAdapterNameTaken"


async def list_adapters(kube: Kube, raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The adapters labelled as this graph's (none when their CRD is not installed)."""
    meta = raw["metadata"]
    return await kube.list(
        SCALING_ADAPTER, meta["namespace"], label_selector(labels.graph_selector(meta["name"]))
    )


async def copy_replicas(
    kube: Kube, raw: dict[str, Any], changes: Mapping[str, int], rendered: Rendered
) -> tuple[dict[str, Any], tuple[Change, ...], dict[str, str]]:
    """Write ``changes`` (service -> the replicas its adapter asks for) into the graph ``raw``. Returns
    the patched graph, a ``Scaled`` change per service, and service -> when it was scaled."""
    meta = raw["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    if not changes:
        return raw, (), {}
    ops = scaling.replicas_patch(raw, changes)
    patched = await kube.patch_json(DGD, namespace, name, ops, field_manager=scaling.FIELD_MANAGER)
    before = {c["name"]: c.get("replicas", 1) for c in (raw.get("spec") or {}).get("components") or []}
    done = []
    for service, replicas in sorted(changes.items()):
        adapter = next(a for a in rendered.adapters if a["spec"]["dgdRef"]["serviceName"] == service)
        message = (
            f"Scaled service {service} from {before.get(service, 1)} to {replicas} replicas, as "
            f"{KIND} {adapter['metadata']['name']} asks"
        )
        logger.info("%s graph=%s/%s", message, namespace, name)
        done.append(Change("Scaled", message))
    return patched, tuple(done), dict.fromkeys(changes, timestamp())


async def sync(
    kube: Kube,
    raw: dict[str, Any],
    rendered: Rendered,
    observed: list[dict[str, Any]],
    counts: Mapping[str, status.ServiceCounts],
    scaled: Mapping[str, str],
) -> tuple[tuple[Notice, ...], tuple[Change, ...]]:
    """Converge the graph's adapters (all but their ``spec.replicas``) and write their status. Returns
    warnings for the adapters that could not be created (the rest of the graph goes on), and the
    adapters created and deleted."""
    meta = raw["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    by_name = {o["metadata"]["name"]: o for o in observed}
    no_crd: list[str] = []  # services whose adapter the API server has no resource type for
    taken: list[Notice] = []
    done: list[Change] = []
    for desired in rendered.adapters:
        adapter = desired["metadata"]["name"]
        service = desired["spec"]["dgdRef"]["serviceName"]
        current = by_name.get(adapter)
        if current is None:
            try:
                current = await kube.create(desired)
            except NotFound:  # the API server has no adapter CRD
                no_crd.append(service)
                continue
            except Conflict:  # not among the graph's (by label), yet its name exists
                message = (
                    f"service {service} sets scalingAdapter, but a {KIND} named {adapter} exists and is not "
                    f"this graph's: delete it (kubectl delete dgdsa {adapter} -n {namespace}) and the "
                    "operator creates the graph's own"
                )
                taken.append(Notice(NAME_TAKEN, message, service=service, warning=True))
                continue
            message = f"Created {KIND} {adapter} for service {service}"
            logger.info("%s graph=%s/%s", message, namespace, name)
            done.append(Change("Created", message))
        elif (patch := scaling.adapter_drift(desired, current)) is not None:
            current = await kube.patch_merge(SCALING_ADAPTER, namespace, adapter, patch)
        if service in counts:
            selector = pod_selector(name, service)
            patch = scaling.adapter_status(current, counts[service].replicas, selector, scaled.get(service))
            if patch is not None:
                await kube.patch_merge(SCALING_ADAPTER, namespace, adapter, patch, subresource="status")
    wanted = {a["metadata"]["name"] for a in rendered.adapters}
    for obj in observed:
        adapter = obj["metadata"]["name"]
        if adapter in wanted or not apply_rules.controlled_by(obj, uid):
            continue
        if await kube.delete(SCALING_ADAPTER, namespace, adapter, uid=obj["metadata"]["uid"]):
            service = ((obj.get("spec") or {}).get("dgdRef") or {}).get("serviceName")
            message = (
                f"Deleted {KIND} {adapter}: service {service} no longer has one (scalingAdapter off, the "
                "service removed, or a planner scales it)"
            )
            logger.info("%s graph=%s/%s", message, namespace, name)
            done.append(Change("Deleted", message))
    if no_crd:
        message = (
            f"scalingAdapter of service {', '.join(no_crd)} has no effect: the API server has no {KIND} "
            "CRD; apply charts/dynamo-operator/crds/ (kubectl apply --server-side -f). Until then the "
            "service keeps the replicas of the graph's spec."
        )
        taken.insert(0, Notice(CRD_MISSING, message, warning=True))
    return tuple(taken), tuple(done)
