"""The reconcile loop: one idempotent, level-triggered visit per graph, driven by a work queue.

A visit reads, renders, applies and writes status, as controller-runtime's reconcilers do:

- read: the graph (fresh, at the stored version) and its scaling adapters;
- render: once, the whole desired state, with the replicas the adapters ask for
  (:mod:`dynamo_operator.reconcile.scaling_adapters`);
- apply: those replicas into the graph, every child by server-side apply, the prune of the children no
  longer desired, the adapters, and the readiness gates of paired revisions;
- status: aggregated from the observed children, written when it changed, with the Events the
  transition is worth (:func:`dynamo_operator.reconcile.outcome.events_for`).

Create, update, resume, drift and child changes all lead to the same visit; the watches in
:mod:`dynamo_operator.reconcile.handlers` only say *which* graph to visit. The loop
(:mod:`dynamo_operator.reconcile.loop`) retries a visit that fails after the graph's backoff, and one
that finds the graph not Ready after ``not_ready_recheck_s``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from dynamo_api.conversion import load_graph
from dynamo_api.models import DynamoGraphDeployment
from pydantic import ValidationError

from dynamo_operator.config import OperatorConfig
from dynamo_operator.reconcile import apply_rules, pair_gate, scaling, scaling_adapters, status
from dynamo_operator.reconcile.conditions import (
    APPLY_FAILED,
    apply_failed_condition,
    invalid_condition,
    problems_from_validation,
)
from dynamo_operator.reconcile.inference_pools import where_installed
from dynamo_operator.reconcile.kube import (
    DEPLOYMENT,
    DGD,
    FIELD_MANAGER,
    INFERENCE_POOL,
    LWS,
    PDB,
    POD,
    POD_GROUP,
    ROLE,
    ROLE_BINDING,
    SERVICE,
    SERVICE_ACCOUNT,
    STATEFULSET,
    Kube,
    KubeError,
    NotFound,
    is_rejection,
    label_selector,
    resource_type,
    timestamp,
)
from dynamo_operator.reconcile.loop import DONE, Key, Loop, Result
from dynamo_operator.reconcile.lora_gate import open_lora_gates, waits_for_lora_gate
from dynamo_operator.reconcile.outcome import Change, Event, Outcome, applied, events_for, pruned, status_for
from dynamo_operator.reconcile.restarts import GroupRestarter
from dynamo_operator.reconcile.workqueue import ExponentialBackoff
from dynamo_operator.render import labels, render
from dynamo_operator.render.names import label_value
from dynamo_operator.render.revision import REVISION_LABEL
from dynamo_operator.render.types import Problem, Rendered

logger = logging.getLogger(__name__)

# Kinds whose children of a graph are pruned when no longer desired. PersistentVolumeClaims are
# deliberately not pruned: removing a volume from the spec must not delete its data.
PRUNE_TYPES = (
    DEPLOYMENT, STATEFULSET, SERVICE, LWS, SERVICE_ACCOUNT, ROLE, ROLE_BINDING, PDB, POD_GROUP, INFERENCE_POOL
)  # fmt: skip


@dataclass(frozen=True)
class Observed:
    """What a visit reads: the graph as stored, its model (None when the spec is invalid: ``problems``)
    and its scaling adapters."""

    raw: dict[str, Any]
    graph: DynamoGraphDeployment | None
    problems: tuple[Problem, ...]
    adapters: list[dict[str, Any]]


@dataclass
class Controller:
    """Owns the graphs' loop and does the visits. All Kubernetes I/O goes through ``kube``."""

    kube: Kube
    config: OperatorConfig
    workers: int = 8
    resync_interval_s: float = 300.0
    not_ready_recheck_s: float = 20.0
    backoff_base_s: float = 2.0  # a failed visit is retried after 2 s, 4 s, 8 s, ... at most the cap
    backoff_cap_s: float = 300.0
    loop: Loop = field(init=False)
    _by_label: dict[Key, str] = field(default_factory=dict, init=False)
    restarter: GroupRestarter = field(init=False)
    # uid -> fingerprint of our last apply to that object: unchanged objects are not applied again.
    _applied: dict[str, apply_rules.Fingerprint] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.loop = Loop(
            "graph",
            self.reconcile,
            workers=self.workers,
            resync_interval_s=self.resync_interval_s,
            backoff=ExponentialBackoff(self.backoff_base_s, self.backoff_cap_s),
            retry_on=(KubeError, aiohttp.ClientError, TimeoutError),
            on_resync=self._applied.clear,  # a full apply of everything now and then, as a safety net
        )
        self.restarter = GroupRestarter(self.kube, self._owner_key)

    # --- what the watches call --------------------------------------------------------------------
    def graph_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if event_type == "DELETED":
            self._forget(key)
            return
        self._by_label[(key[0], label_value(key[1]))] = key[1]
        self.loop.seen(key, meta.get("resourceVersion"))

    def child_event(self, body: Mapping[str, Any]) -> None:
        """A child of ours (workload, Service, scaling adapter) changed or was deleted: visit its graph."""
        key = self._owner_key(body)
        if key is not None:
            self.loop.queue.add(key)

    async def pod_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A pod of ours changed: restart its multinode group if it failed or was deleted, and visit
        its graph when the pod is stuck (unschedulable, image pull, crash loop), so the Ready message
        says why promptly, or waits for its readiness gate (``reconcile.pair_gate``).

        Other pod changes need no visit: the pods' workloads (Deployments, StatefulSets, LWS) update
        their own status, and those changes are watched."""
        pod = dict(body)
        await self.restarter.pod_event(event_type, pod)
        if event_type == "DELETED":
            return
        if status.pod_problem(pod) is not None or pair_gate.waits_for_gate(pod) or waits_for_lora_gate(pod):
            self.child_event(pod)

    def _forget(self, key: Key) -> None:
        self.loop.forget(key)
        self._by_label.pop((key[0], label_value(key[1])), None)

    def _owner_key(self, body: Mapping[str, Any]) -> Key | None:
        meta = body.get("metadata", {})
        namespace = meta.get("namespace")
        for ref in meta.get("ownerReferences") or []:
            if ref.get("kind") == DGD.kind and ref.get("controller"):
                return (namespace, ref["name"])
        graph = (meta.get("labels") or {}).get(labels.GRAPH)
        if namespace and graph:
            return (namespace, self._by_label.get((namespace, graph), graph))
        return None

    # --- the visit -------------------------------------------------------------------------------
    async def reconcile(self, key: Key) -> Result:
        """One visit: read, render, apply, status. A graph that is not Ready is visited again after
        ``not_ready_recheck_s``."""
        observed = await self._read(*key)
        if observed is None:
            return DONE
        rendered, copies = self._render(observed)
        if rendered.problems:
            await self._write_status(observed.raw, self._invalid(observed.raw, rendered))
            return DONE
        rendered = await where_installed(self.kube, rendered)  # the InferencePool needs GAIE's CRD
        done: list[Change] = []
        try:
            raw, outcome = await self._apply(observed, rendered, copies, done)
        except Exception:
            # What was done before the failure is still told; the retry will not do it again.
            await self._post(observed.raw, [Event("Normal", c.reason, c.message) for c in done])
            raise
        await self._write_status(raw, outcome)
        if outcome.ready.reason == APPLY_FAILED:
            raise KubeError(422, APPLY_FAILED, outcome.ready.message)  # retried after the backoff
        return DONE if outcome.ready.status == "True" else Result(requeue_after=self.not_ready_recheck_s)

    # --- read ------------------------------------------------------------------------------------
    async def _read(self, namespace: str, name: str) -> Observed | None:
        """The graph and its scaling adapters; None when it is gone or being deleted (the garbage
        collector removes the children: ownerReferences)."""
        raw = await self.kube.get(DGD, namespace, name)
        if raw is None:
            self._forget((namespace, name))
            return None
        if raw["metadata"].get("deletionTimestamp"):
            return None
        try:
            graph = load_graph(raw)  # v1beta1 as stored -> the internal model render works from
        except ValidationError as exc:
            return Observed(raw, None, problems_from_validation(exc), [])
        return Observed(raw, graph, (), await scaling_adapters.list_adapters(self.kube, raw))

    # --- render ----------------------------------------------------------------------------------
    def _render(self, observed: Observed) -> tuple[Rendered, dict[str, int]]:
        """The desired state, rendered with the replicas the adapters ask for (service -> replicas, also
        returned). A crash of the renderer (a bug) is reported on the graph instead of retried hot."""
        if observed.graph is None:
            return Rendered(problems=observed.problems), {}
        dgd = observed.graph
        try:
            copies = scaling.replicas_asked(dgd, observed.adapters)
            return render(scaling.with_replicas(dgd, copies), self.config), copies
        except Exception as exc:  # mapped to a condition + Event, and logged with the traceback
            logger.exception("Render failed graph=%s/%s", dgd.namespace, dgd.name)
            message = (
                f"The operator could not render this graph ({type(exc).__name__}: {exc}). This is a bug in "
                "the operator: please report it with the manifest; editing the spec retries."
            )
            return Rendered(problems=(Problem(field="spec", reason="RenderFailed", message=message),)), {}

    # --- apply -----------------------------------------------------------------------------------
    async def _apply(
        self, observed: Observed, rendered: Rendered, copies: Mapping[str, int], done: list[Change]
    ) -> tuple[dict[str, Any], Outcome]:
        """Make the world as ``rendered`` says; what it changed is appended to ``done``. Returns the graph
        (with the copied replicas) and the outcome for status."""
        raw, scaled_changes, scaled = await scaling_adapters.copy_replicas(
            self.kube, observed.raw, copies, rendered
        )
        done += scaled_changes
        meta = raw["metadata"]
        namespace, name, generation = meta["namespace"], meta["name"], meta.get("generation")
        conflict = scaling.conflict_condition(rendered.scaling_conflicts, rendered.adapters)
        applied_objects, rejections = await self._apply_all(raw, rendered, done)
        if rejections:
            ready = apply_failed_condition(rejections)
            notices = rendered.notices
            return raw, Outcome(
                generation, ready, status.STATE_FAILED, notices=notices, scaling=conflict, changes=tuple(done)
            )
        counts = status.all_counts(
            rendered.services, applied_objects, component_label=labels.COMPONENT, group_label=labels.GROUP
        )
        warnings, adapter_changes = await scaling_adapters.sync(
            self.kube, raw, rendered, observed.adapters, counts, scaled
        )
        done += adapter_changes
        pods_selector = f"{labels.GRAPH}={label_value(name)}"
        ready = status.ready_condition(counts, pods_selector)
        if ready.status != "True":  # open readiness gates; say why, when the pods' status states it
            pods = await self.kube.list(POD, namespace, label_selector(labels.graph_selector(name)))
            done += await open_lora_gates(self.kube, raw, pods)  # before pairing: a pair needs its adapters
            done += await self._open_gates(raw, rendered, pods)
            problems = status.pod_problems(pods, component_label=labels.COMPONENT)
            ready = status.ready_condition(counts, pods_selector, problems)
        state = status.STATE_SUCCESSFUL if ready.status == "True" else status.STATE_PENDING
        outcome = Outcome(
            generation,
            ready,
            state,
            notices=rendered.notices + warnings,
            scaling=conflict,
            counts=counts,
            changes=tuple(done),
        )
        return raw, outcome

    async def _open_gates(
        self, raw: dict[str, Any], rendered: Rendered, pods: list[dict[str, Any]]
    ) -> list[Change]:
        """Set the readiness gate of the prefill and decode pods whose revision has both roles serving
        (``reconcile.pair_gate``)."""
        roles = {service: p.role for service, p in rendered.services.items()}
        names = pair_gate.gates_to_open(pods, roles)
        if not names:
            return []
        namespace = raw["metadata"]["namespace"]
        revisions = sorted(
            {
                (p["metadata"].get("labels") or {}).get(REVISION_LABEL, "")
                for p in pods
                if p["metadata"]["name"] in names
            }
        )
        for pod in names:
            try:
                await self.kube.patch_strategic(
                    POD, namespace, pod, pair_gate.paired_condition(timestamp()), subresource="status"
                )
            except NotFound:
                continue  # deleted meanwhile
        message = (
            f"Revision {', '.join(revisions)} has prefill and decode pods serving: opened the readiness "
            f"gate of {len(names)} pod(s) ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
        )
        logger.info("%s graph=%s/%s", message, namespace, raw["metadata"]["name"])
        return [Change("RevisionPaired", message)]

    async def _apply_all(
        self, raw: dict[str, Any], rendered: Rendered, done: list[Change]
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """Apply every desired child and, when the API server took them all, prune those no longer
        desired. Returns the children as applied (or left unchanged) and what the API server rejected
        (``"<Kind> <name>: why"``); what was created, updated or deleted is appended to ``done``."""
        meta = raw["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        types = {t.kind: t for t in PRUNE_TYPES}
        for obj in rendered.objects:
            rt = resource_type(obj["apiVersion"], obj["kind"])
            types.setdefault(rt.kind, rt)
        selector = label_selector(labels.graph_selector(name))
        listed = await asyncio.gather(*(self.kube.list(t, namespace, selector) for t in types.values()))
        observed = [o for items in listed for o in items]
        before = {apply_rules.key(o): o for o in observed}

        async def apply_one(obj: dict[str, Any]) -> dict[str, Any] | str:
            current = before.get(apply_rules.key(obj))
            last = self._applied.get(current["metadata"]["uid"]) if current else None
            if current is not None and not apply_rules.needs_apply(obj, current, last, FIELD_MANAGER):
                return current
            try:
                after = await self.kube.apply(obj)
            except KubeError as exc:
                if not is_rejection(exc):
                    raise
                logger.warning(
                    "Could not apply %s name=%s error=%s", obj["kind"], obj["metadata"]["name"], exc
                )
                return f"{obj['kind']} {obj['metadata']['name']}: {exc.message}"
            self._applied[after["metadata"]["uid"]] = apply_rules.fingerprint(obj, after, FIELD_MANAGER)
            action = apply_rules.apply_outcome(current, after, FIELD_MANAGER)
            if action is not None:
                kind, child = obj["kind"], obj["metadata"]["name"]
                logger.info("%s %s name=%s graph=%s/%s", action, kind, child, namespace, name)
                done.append(applied(action, kind, child))
            return after

        results = await asyncio.gather(*(apply_one(o) for o in rendered.objects))
        applied_objects = [r for r in results if isinstance(r, dict)]
        rejections = [r for r in results if isinstance(r, str)]
        if rejections:
            return applied_objects, rejections
        prune_types = {t.kind for t in PRUNE_TYPES}
        for obj in apply_rules.to_prune(observed, rendered.objects, uid):
            if obj["kind"] not in prune_types:
                continue
            kind, child = obj["kind"], obj["metadata"]["name"]
            self._applied.pop(obj["metadata"]["uid"], None)
            if await self.kube.delete(
                resource_type(obj["apiVersion"], kind), namespace, child, uid=obj["metadata"]["uid"]
            ):
                logger.info("Deleted %s name=%s graph=%s/%s", kind, child, namespace, name)
                done.append(pruned(kind, child))
        return applied_objects, rejections

    # --- status ----------------------------------------------------------------------------------
    @staticmethod
    def _invalid(raw: dict[str, Any], rendered: Rendered) -> Outcome:
        """The outcome of a visit that found the spec invalid: nothing was changed."""
        ready = invalid_condition(rendered.problems)
        generation = raw["metadata"].get("generation")
        return Outcome(generation, ready, status.STATE_FAILED, problems=rendered.problems)

    async def _write_status(self, raw: dict[str, Any], outcome: Outcome) -> None:
        """Post the Events of the transition, then patch status when it changed."""
        meta = raw["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        current = raw.get("status") or {}
        await self._post(raw, events_for(current, outcome))
        new = status_for(current, outcome, now=timestamp(), group_backend=self.config.group_backend)
        # lastTransitionTime is kept for unchanged conditions, so equal content means no write.
        patch = status.status_patch(current, new)
        if patch is None:
            return
        answer = await self.kube.patch_merge(DGD, namespace, name, patch, subresource="status")
        self.loop.wrote((namespace, name), answer["metadata"]["resourceVersion"])
        logger.info(
            "Updated status graph=%s/%s state=%s ready=%s reason=%s",
            namespace,
            name,
            outcome.state,
            outcome.ready.status,
            outcome.ready.reason,
        )

    async def _post(self, raw: dict[str, Any], events: list[Event]) -> None:
        meta = raw["metadata"]
        for event in events:
            if event.type == "Warning":
                logger.warning(
                    "%s graph=%s/%s reason=%s", event.message, meta["namespace"], meta["name"], event.reason
                )
            await self.kube.post_event(raw, type_=event.type, reason=event.reason, message=event.message)
