"""Open the LoRA readiness gate (``render.lora_gate``) of a graph's worker pods that hold their adapters.

Part of a graph's visit, while the graph is not Ready: for each serving pod whose gate is still closed,
the adapters the namespace's ``DynamoModel``s declare for the pod's base model (``lora``/``adapter``,
valid, not being deleted) are put on it (``dynamo_clients.lora_client.ensure``, the same call the
DynamoModel's own visit makes), and the gate is opened once each adapter is held, or was refused for
good (``Refusal.permanent``: the DynamoModel's condition and Events say why; a broken adapter does not
hold a rollout up forever). A pod that does not answer, answers ``NoFreeSlot`` or
``SourceUnreachable``, or takes longer than ``GATE_LOAD_TIMEOUT_S`` to load (the graph's visit does not
wait on a download), keeps its gate closed until a later visit: in a rollout the old pods keep serving
the adapter meanwhile. Like the pairing gate, it is never closed again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
from dynamo_api.components import components
from dynamo_api.conversion import load_graph
from dynamo_api.dynamo_model import DynamoModel, problems
from dynamo_api.loras import base_model_of
from dynamo_clients import lora_client
from pydantic import ValidationError

from dynamo_operator.reconcile import model_endpoints as me
from dynamo_operator.reconcile.kube import DYNAMO_MODEL, POD, Kube, NotFound, timestamp
from dynamo_operator.reconcile.model_endpoints import waits_for_lora_gate
from dynamo_operator.reconcile.outcome import Change
from dynamo_operator.render import labels

__all__ = ["open_lora_gates", "waits_for_lora_gate"]

logger = logging.getLogger(__name__)

# A load the graph's visit waits for: a longer one (an hf:// download) goes on in the worker, and the
# DynamoModel's own visit (which waits longer) or a later graph visit finds it held.
GATE_LOAD_TIMEOUT_S = 10.0


async def declared_adapters(kube: Kube, namespace: str) -> list[DynamoModel]:
    """The namespace's valid lora/adapter DynamoModels that are not being deleted."""
    found = []
    for raw in await kube.list(DYNAMO_MODEL, namespace):
        if (raw.get("metadata") or {}).get("deletionTimestamp"):
            continue
        try:
            dm = DynamoModel.model_validate(raw)
        except ValidationError:
            continue
        if dm.spec.loads_adapter and not problems(dm) and not me.cluster_problems(dm):
            found.append(dm)
    return found


async def _settled(
    session: aiohttp.ClientSession, pod: Mapping[str, Any], wanted: Sequence[DynamoModel]
) -> bool:
    """Whether ``pod`` holds each of ``wanted`` now (loading what it lacks), or refused it for good."""
    address = me.endpoint_of(pod).address
    for dm in wanted:
        assert dm.spec.source is not None  # problems() is empty
        try:
            outcome = await lora_client.ensure(
                session, address, dm.spec.model_name, dm.spec.source.uri, load_timeout_s=GATE_LOAD_TIMEOUT_S
            )
        except lora_client.SystemPortUnreachable:
            return False
        if not outcome.held and (outcome.refusal is None or not outcome.refusal.permanent):
            return False
    return True


async def open_lora_gates(kube: Kube, raw: dict[str, Any], pods: Sequence[Mapping[str, Any]]) -> list[Change]:
    """Open the gate of ``pods`` (the graph's) that hold their adapters; the change, for the graph's
    Event (``LorasLoaded``)."""
    waiting = [p for p in pods if waits_for_lora_gate(p)]
    if not waiting:
        return []
    namespace = raw["metadata"]["namespace"]
    bases = {c.name: base_model_of(c) for c in components(load_graph(raw))}
    declared = await declared_adapters(kube, namespace)

    def wanted(pod: Mapping[str, Any]) -> list[DynamoModel]:
        base = bases.get((pod["metadata"].get("labels") or {}).get(labels.COMPONENT, ""))
        return [dm for dm in declared if dm.spec.base_model_name == base]

    async with aiohttp.ClientSession() as session:
        settled = await asyncio.gather(*(_settled(session, p, wanted(p)) for p in waiting))
    opened = []
    for pod, done in zip(waiting, settled, strict=True):
        if not done:
            continue
        names = [dm.spec.model_name for dm in wanted(pod)]
        try:
            await kube.patch_strategic(
                POD,
                namespace,
                pod["metadata"]["name"],
                me.gate_condition(timestamp(), names),
                subresource="status",
            )
        except NotFound:
            continue  # deleted meanwhile
        opened.append(pod["metadata"]["name"])
    if not opened:
        return []
    shown = ", ".join(opened[:5]) + (", ..." if len(opened) > 5 else "")
    message = f"Opened the LoRA readiness gate of {len(opened)} pod(s) holding their adapters: {shown}"
    logger.info("%s graph=%s/%s", message, namespace, raw["metadata"]["name"])
    return [Change("LorasLoaded", message)]
