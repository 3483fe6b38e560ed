"""The DynamoModel reconcile: one level-triggered visit per model, driven by its own ``reconcile.loop``.

Every visit reads the model, the namespace's graphs and its worker pods fresh, finds the endpoints
(``reconcile.model_endpoints``), asks each what it holds and loads the adapter where it is missing, or
was loaded from another ``source.uri`` (``dynamo_clients.lora_client.ensure``), and writes status from those
answers. Pods coming and going, graphs changing, the model changing: each leads to the same visit. A model
whose endpoints are not all ready is visited again with a growing delay (1 s doubling to 60 s), every
model every ``resync_interval_s``, so a worker that lost its adapters (an engine restart) gets them back.

A ``lora``/``adapter`` model carries the finalizer ``dynamo_model.FINALIZER``: deleting it unloads the
adapter from every endpoint that answers (each call bounded), then removes the finalizer; a pod that is
gone or does not answer does not hold the deletion up (a Warning Event names it).

Events are posted on transitions (a condition that changed), and for each load, reload and unload.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from dynamo_api.conversion import load_graph
from dynamo_api.dynamo_model import FINALIZER, DynamoModel, problems
from dynamo_api.models import DynamoGraphDeployment
from dynamo_clients import lora_client
from pydantic import ValidationError

from dynamo_operator.reconcile import conditions
from dynamo_operator.reconcile import model_endpoints as me
from dynamo_operator.reconcile.conditions import Cond, problems_from_validation
from dynamo_operator.reconcile.kube import (
    DGD,
    DYNAMO_MODEL,
    FIELD_MANAGER,
    POD,
    Kube,
    KubeError,
    label_selector,
    timestamp,
)
from dynamo_operator.reconcile.loop import DONE, Key, Loop, Result
from dynamo_operator.reconcile.workqueue import ExponentialBackoff
from dynamo_operator.render import labels

__all__ = ["ModelController"]

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0
CONCURRENCY = 16  # endpoints asked at once, per visit


def _key(body: Mapping[str, Any]) -> Key:
    return (body["metadata"]["namespace"], body["metadata"]["name"])


async def list_graphs(kube: Kube, namespace: str) -> list[DynamoGraphDeployment]:
    """The namespace's graphs that parse (one that does not is its own controller's to report)."""
    graphs = []
    for raw in await kube.list(DGD, namespace):
        if (raw.get("metadata") or {}).get("deletionTimestamp"):
            continue
        try:
            graphs.append(load_graph(raw))
        except ValidationError:
            continue
    return graphs


async def list_worker_pods(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    return await kube.list(POD, namespace, label_selector({labels.MANAGED_BY: labels.MANAGED_BY_VALUE}))


async def observe(
    session: aiohttp.ClientSession, dm: DynamoModel, endpoint: me.Endpoint
) -> tuple[me.ObservedEndpoint, str]:
    """Ask one endpoint, loading the adapter when it lacks it: what was found, and what was done."""
    if not dm.spec.loads_adapter or dm.spec.source is None:
        return me.ObservedEndpoint(endpoint, ready=True), "none"
    try:
        outcome = await lora_client.ensure(session, endpoint.address, dm.spec.model_name, dm.spec.source.uri)
    except lora_client.SystemPortUnreachable as exc:
        return me.ObservedEndpoint(endpoint, ready=False, unreachable=str(exc)), "none"
    return me.ObservedEndpoint(endpoint, ready=outcome.held, refusal=outcome.refusal), outcome.action


@dataclass
class ModelController:
    """Owns the DynamoModels' loop and does the visits. All Kubernetes I/O goes through ``kube``."""

    kube: Kube
    workers: int = 4
    resync_interval_s: float = 300.0
    loop: Loop = field(init=False)
    _not_ready: ExponentialBackoff[Key] = field(
        default_factory=lambda: ExponentialBackoff(base_s=1.0, cap_s=MAX_BACKOFF_S), init=False
    )
    _generations: dict[Key, int | None] = field(default_factory=dict, init=False)  # graphs'
    _pods: dict[str, tuple[bool, str]] = field(default_factory=dict, init=False)  # uid -> (serving, IP)
    _session: aiohttp.ClientSession | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.loop = Loop(
            "model",
            self.reconcile,
            workers=self.workers,
            resync_interval_s=self.resync_interval_s,
            backoff=ExponentialBackoff(base_s=2.0, cap_s=MAX_BACKOFF_S),
            retry_on=(KubeError, aiohttp.ClientError, TimeoutError),
        )

    def start(self) -> None:
        self._session = aiohttp.ClientSession()
        self.loop.start()

    async def stop(self) -> None:
        await self.loop.stop()
        if self._session is not None:
            await self._session.close()

    # --- what the watches call ------------------------------------------------------------------
    def model_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        key = _key(body)
        if event_type == "DELETED":
            self._forget(key)
            return
        self.loop.seen(key, body["metadata"].get("resourceVersion"))

    def graph_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A graph appeared, changed its spec or went: its namespace's models may target other workers."""
        key = _key(body)
        generation = body["metadata"].get("generation")
        if event_type == "DELETED":
            self._generations.pop(key, None)
        elif self._generations.get(key, -1) == generation:
            return  # a status write: the pods say the rest
        else:
            self._generations[key] = generation
        self.namespace_changed(key[0])

    def pod_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A pod of ours started or stopped serving, or went: its namespace's models are visited."""
        meta = body.get("metadata") or {}
        uid = meta.get("uid", "")
        if event_type == "DELETED":
            if self._pods.pop(uid, None) is None:
                return
        else:
            state = (me.serving(body), (body.get("status") or {}).get("podIP", ""))
            if self._pods.get(uid) == state:
                return
            self._pods[uid] = state
        self.namespace_changed(meta.get("namespace", ""))

    def namespace_changed(self, namespace: str) -> None:
        for key in [k for k in self.loop.known if k[0] == namespace]:
            self.loop.queue.add(key)

    def _forget(self, key: Key) -> None:
        self.loop.forget(key)
        self._not_ready.forget(key)

    # --- the visit ------------------------------------------------------------------------------
    async def reconcile(self, key: Key) -> Result:
        ready = await self._visit(*key)
        if ready is False:  # not every endpoint holds it yet: again soon, then less often
            return Result(requeue_after=self._not_ready.when(key))
        self._not_ready.forget(key)
        return DONE

    async def _visit(self, namespace: str, name: str) -> bool | None:
        """One visit. Returns whether the model is Ready (None: nothing to wait for)."""
        raw = await self.kube.get(DYNAMO_MODEL, namespace, name)
        if raw is None:
            self._forget((namespace, name))
            return None
        try:
            dm = DynamoModel.model_validate(raw)
        except ValidationError as exc:
            if raw["metadata"].get("deletionTimestamp"):
                await self._finalize(raw, None)  # nothing can be unloaded without a model name
            else:
                await self._write(raw, me.invalid_conditions(problems_from_validation(exc)), None)
            return None
        if raw["metadata"].get("deletionTimestamp"):
            await self._finalize(raw, dm)
            return None
        found = problems(dm) + me.cluster_problems(dm)
        if found:
            await self._write(raw, me.invalid_conditions(found), None)
            return None
        if dm.spec.loads_adapter:
            await self._add_finalizer(raw)
        wanted, pods = await self._targets(dm)
        found_endpoints = me.endpoints(pods, wanted)
        observed = await self._observe(raw, dm, found_endpoints)
        conds = me.model_conditions(dm, wanted, observed)
        await self._write(raw, conds, observed)
        return conds[0].status == "True"

    async def _targets(self, dm: DynamoModel) -> tuple[dict[str, tuple[str, ...]], list[dict[str, Any]]]:
        graphs, pods = await asyncio.gather(
            list_graphs(self.kube, dm.namespace), list_worker_pods(self.kube, dm.namespace)
        )
        return me.targets(graphs, dm.spec.base_model_name), pods

    async def _observe(
        self, raw: dict[str, Any], dm: DynamoModel, found: Sequence[me.Endpoint]
    ) -> list[me.ObservedEndpoint]:
        assert self._session is not None, "start() the controller first"
        session = self._session
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(endpoint: me.Endpoint) -> tuple[me.ObservedEndpoint, str]:
            async with gate:
                return await observe(session, dm, endpoint)

        results = await asyncio.gather(*(one(e) for e in found))
        for action in ("loaded", "reloaded"):
            pods = [o.endpoint.pod for o, done in results if done == action]
            if pods:
                uri = dm.spec.source.uri if dm.spec.source else ""
                message = (
                    f"{action.capitalize()} adapter {dm.spec.model_name} from {uri} on {len(pods)} pod(s): "
                    + ", ".join(pods)
                )
                logger.info("%s model=%s/%s", message, dm.namespace, dm.name)
                await self.kube.post_event(raw, type_="Normal", reason="LoRALoaded", message=message)
        return [o for o, _ in results]

    async def _write(
        self, raw: dict[str, Any], wanted: list[Cond], observed: Sequence[me.ObservedEndpoint] | None
    ) -> None:
        """Post the Events of changed conditions and write status (nothing when it is unchanged)."""
        meta = raw["metadata"]
        current = raw.get("status") or {}
        current_conds = current.get("conditions") or []
        ready = wanted[0]
        for event in me.model_events(current_conds, ready):
            await self.kube.post_event(raw, type_=event.type, reason=event.reason, message=event.message)
        if conditions.changed(current_conds, ready):
            logger.info(
                "Model %s/%s ready=%s reason=%s: %s",
                meta["namespace"],
                meta["name"],
                ready.status,
                ready.reason,
                ready.message,
            )
        new: dict[str, Any] = {
            "conditions": conditions.merge(
                current_conds, wanted, now=timestamp(), generation=meta.get("generation")
            ),
            "observedGeneration": meta.get("generation"),
            **(me.status_body(observed) if observed is not None else me.status_body([])),
        }
        if all(current.get(k) == v for k, v in new.items()):
            return
        answer = await self.kube.patch_merge(
            DYNAMO_MODEL, meta["namespace"], meta["name"], {"status": new}, subresource="status"
        )
        self.loop.wrote(_key(raw), answer["metadata"]["resourceVersion"])

    # --- the finalizer --------------------------------------------------------------------------
    async def _add_finalizer(self, raw: dict[str, Any]) -> None:
        current = raw["metadata"].get("finalizers")
        if current and FINALIZER in current:
            return
        ops: list[dict[str, Any]] = (
            [
                {"op": "test", "path": "/metadata/finalizers", "value": current},
                {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER},
            ]
            if current
            else [{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}]
        )
        meta = raw["metadata"]
        answer = await self.kube.patch_json(
            DYNAMO_MODEL, meta["namespace"], meta["name"], ops, field_manager=FIELD_MANAGER
        )
        raw["metadata"] = answer["metadata"]

    async def _finalize(self, raw: dict[str, Any], dm: DynamoModel | None) -> None:
        """Unload the adapter from every endpoint that answers, then let the deletion finish."""
        finalizers = raw["metadata"].get("finalizers") or []
        if FINALIZER not in finalizers:
            return
        if dm is not None and dm.spec.loads_adapter:
            await self._unload_everywhere(raw, dm)
        meta = raw["metadata"]
        ops = [
            {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
            {
                "op": "replace",
                "path": "/metadata/finalizers",
                "value": [f for f in finalizers if f != FINALIZER],
            },
        ]
        await self.kube.patch_json(
            DYNAMO_MODEL, meta["namespace"], meta["name"], ops, field_manager=FIELD_MANAGER
        )
        logger.info("Finalized model=%s/%s", meta["namespace"], meta["name"])

    async def _unload_everywhere(self, raw: dict[str, Any], dm: DynamoModel) -> None:
        assert self._session is not None, "start() the controller first"
        session = self._session
        wanted, pods = await self._targets(dm)
        found = me.endpoints(pods, wanted)

        async def one(endpoint: me.Endpoint) -> str | None:
            try:
                await lora_client.unload(session, endpoint.address, dm.spec.model_name)
            except lora_client.LoraClientError as exc:
                return f"{endpoint.pod}: {exc}"
            return None

        failed = [f for f in await asyncio.gather(*(one(e) for e in found)) if f is not None]
        done = len(found) - len(failed)
        if done:
            message = f"Unloaded adapter {dm.spec.model_name} from {done} endpoint(s)"
            await self.kube.post_event(raw, type_="Normal", reason="LoRAUnloaded", message=message)
        if failed:
            message = (
                f"Could not unload adapter {dm.spec.model_name} from {len(failed)} endpoint(s), deleting the "
                f"model anyway: {'; '.join(failed)}. A worker that still holds it serves it until it "
                "restarts; DELETE /v1/loras/<name> on its system port unloads it by hand"
            )
            logger.warning("%s model=%s/%s", message, dm.namespace, dm.name)
            await self.kube.post_event(raw, type_="Warning", reason="LoRAUnloadFailed", message=message)
