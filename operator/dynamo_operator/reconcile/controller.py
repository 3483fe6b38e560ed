"""The reconcile loop: one idempotent, level-triggered visit per graph, driven by a work queue.

Every visit reads the graph fresh, renders its whole desired state, applies it (server-side apply),
prunes the children that are no longer desired, and writes status aggregated from the observed
children. Create, update, resume, drift and child changes all lead to the same visit; the watches
in :mod:`dynamo_operator.reconcile.handlers` only say *which* graph to visit. A visit first copies the
replicas the graph's scaling adapters ask for into the graph (:mod:`dynamo_operator.reconcile.adapters`),
then renders, and converges the adapters after the children.

Events are posted on transitions only (a new spec generation, or a condition that changed), so a
restart of the operator or a repeated visit does not repeat them.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
from dynamo_api.conversion import load_graph
from dynamo_api.models import DynamoGraphDeployment
from pydantic import ValidationError

from dynamo_operator.config import OperatorConfig
from dynamo_operator.reconcile import adapters, conditions, pairing, plan, scaling, status
from dynamo_operator.reconcile.conditions import READY, Cond
from dynamo_operator.reconcile.kube import (
    DEPLOYMENT,
    DGD,
    FIELD_MANAGER,
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
    label_selector,
    resource_type,
)
from dynamo_operator.reconcile.lora_gate import open_lora_gates, waits_for_lora_gate
from dynamo_operator.reconcile.restarts import GroupRestarter
from dynamo_operator.reconcile.workqueue import WorkQueue
from dynamo_operator.render import labels, render
from dynamo_operator.render.names import label_value
from dynamo_operator.render.revision import REVISION_LABEL
from dynamo_operator.render.types import Notice, Problem, Rendered

logger = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)

# Kinds whose children of a graph are pruned when no longer desired. PersistentVolumeClaims are
# deliberately not pruned: removing a volume from the spec must not delete its data.
PRUNE_TYPES = (DEPLOYMENT, STATEFULSET, SERVICE, LWS, SERVICE_ACCOUNT, ROLE, ROLE_BINDING, PDB, POD_GROUP)
WARNINGS = "SpecWarnings"
TRANSPORT = "Transport"
MAX_BACKOFF_S = 300.0
# API answers that a retry cannot fix: the object itself is wrong (or forbidden).
_CLIENT_ERRORS = frozenset({400, 403, 422})
# Server-side apply answers 500 (not 422) when a field has the wrong type, e.g. a string where
# extraPodSpec needs a list: the object is wrong, so no retry can fix it either.
_TYPED_PATCH_ERROR = "failed to create typed patch object"


def is_rejection(exc: KubeError) -> bool:
    """Whether the API server rejected the object itself (fix the spec) rather than failed to serve."""
    return exc.status in _CLIENT_ERRORS or (exc.status == 500 and _TYPED_PATCH_ERROR in exc.message)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _shown_input(path: str, value: Any) -> str:
    """What a condition may quote of an invalid value: never an env var's value (it may be a token),
    and of an object only its keys, since conditions and Events are readable by anyone who can read
    the graph."""
    if "env" in path.lower():
        return "a value not shown: env values may be secrets"
    if isinstance(value, dict):
        return f"an object with keys {sorted(map(str, value))}"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    return repr(value)[:80]


def problems_from_validation(exc: ValidationError) -> tuple[Problem, ...]:
    """Pydantic errors of a spec that passed the CRD schema, as render-style problems."""
    result = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"])
        got = _shown_input(path, err.get("input"))
        message = f"{err['msg']} (got {got}); set a valid value for this field."
        result.append(Problem(field=path, reason="InvalidField", message=message))
    return tuple(result)


def invalid_condition(problems: tuple[Problem, ...]) -> Cond:
    reason = problems[0].reason if len({p.reason for p in problems}) == 1 else "InvalidSpec"
    message = "; ".join(f"{p.field}: {p.message}" for p in problems)
    return Cond(READY, "False", reason, f"Invalid spec, nothing was changed: {message}")


def warnings_condition(notices: tuple[Notice, ...]) -> Cond:
    warns = [n for n in notices if n.warning]
    if not warns:
        return Cond(WARNINGS, "False", "NoWarnings", "The spec raised no warnings")
    reason = warns[0].reason if len({n.reason for n in warns}) == 1 else "MultipleWarnings"
    return Cond(WARNINGS, "True", reason, "; ".join(n.message for n in warns))


def transport_condition(notices: tuple[Notice, ...]) -> Cond | None:
    stated = [n for n in notices if not n.warning and n.reason.endswith("Transport")]
    if not stated:
        return None
    reasons = {n.reason for n in stated}
    reason = stated[0].reason if len(reasons) == 1 else "MixedTransport"
    return Cond(TRANSPORT, "True", reason, "; ".join(n.message for n in stated))


def ready_condition(
    counts: Mapping[str, status.ServiceCounts], graph: str, problems: Mapping[str, str] | None = None
) -> Cond:
    return status.ready_condition(counts, f"{labels.GRAPH}={label_value(graph)}", problems)


def lost_readiness(current: list[dict], ready: Cond) -> bool:
    """Whether a Ready graph is no longer ready (e.g. a pod crashed): worth a Warning Event."""
    old = conditions.find(current, READY)
    return ready.status != "True" and old is not None and old.get("status") == "True"


def status_patch(current: dict, new: dict) -> dict | None:
    """The merge patch that turns ``current`` status into ``new`` (None when equal); services that
    disappeared are removed explicitly (merge patch keeps absent map keys)."""
    if all(current.get(k) == v for k, v in new.items()):
        return None
    patch = dict(new)
    gone = set(current.get("services") or {}) - set(new.get("services") or {})
    if gone:
        patch["services"] = {**(new.get("services") or {}), **dict.fromkeys(gone)}
    return {"status": patch}


@dataclass
class Controller:
    """Owns the work queue and does the visits. All Kubernetes I/O goes through ``kube``."""

    kube: Kube
    config: OperatorConfig
    workers: int = 8
    resync_interval_s: float = 300.0
    not_ready_recheck_s: float = 20.0
    queue: WorkQueue[Key] = field(init=False)
    _known: dict[Key, None] = field(default_factory=dict, init=False)
    _by_label: dict[Key, str] = field(default_factory=dict, init=False)
    _own_writes: dict[Key, str] = field(default_factory=dict, init=False)
    _failures: dict[Key, int] = field(default_factory=dict, init=False)
    restarter: GroupRestarter = field(init=False)
    _resync_task: asyncio.Task | None = field(default=None, init=False)
    # uid -> fingerprint of our last apply to that object: unchanged objects are not applied again.
    _applied: dict[str, plan.Fingerprint] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.queue = WorkQueue(self.reconcile, workers=self.workers)
        self.restarter = GroupRestarter(self.kube, self._owner_key)

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self.queue.start()
        self._resync_task = asyncio.create_task(self._resync(), name="resync")

    async def stop(self) -> None:
        if self._resync_task is not None:
            self._resync_task.cancel()
            await asyncio.gather(self._resync_task, return_exceptions=True)
        await self.queue.stop()

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.resync_interval_s)
            self._applied.clear()  # a full apply of everything now and then, as a safety net
            for key in list(self._known):
                self.queue.add(key)

    # --- what the watches call --------------------------------------------------------------------
    def graph_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if event_type == "DELETED":
            self._forget(key)
            return
        self._known[key] = None
        self._by_label[(key[0], label_value(key[1]))] = key[1]
        if self._own_writes.get(key) == meta.get("resourceVersion"):
            return  # our own status write: nothing new to act on
        self.queue.add(key)

    def child_event(self, body: Mapping[str, Any]) -> None:
        """A child of ours (workload, Service, scaling adapter) changed or was deleted: visit its graph."""
        key = self._owner_key(body)
        if key is not None:
            self.queue.add(key)

    async def pod_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A pod of ours changed: restart its multinode group if it failed or was deleted, and visit
        its graph when the pod is stuck (unschedulable, image pull, crash loop), so the Ready message
        says why promptly, or waits for its readiness gate (``reconcile.pairing``).

        Other pod changes need no visit: the pods' workloads (Deployments, StatefulSets, LWS) update
        their own status, and those changes are watched."""
        pod = dict(body)
        await self.restarter.pod_event(event_type, pod)
        if event_type == "DELETED":
            return
        if status.pod_problem(pod) is not None or pairing.waits_for_gate(pod) or waits_for_lora_gate(pod):
            self.child_event(pod)

    def _forget(self, key: Key) -> None:
        self._known.pop(key, None)
        self._own_writes.pop(key, None)
        self._failures.pop(key, None)
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
    async def reconcile(self, key: Key) -> None:
        namespace, name = key
        try:
            ready = await self._visit(namespace, name)
        except (KubeError, aiohttp.ClientError, TimeoutError) as exc:
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
            delay = min(MAX_BACKOFF_S, 2.0**failures)
            logger.warning(
                "Could not reconcile graph=%s/%s error=%s retry_in=%.0fs", namespace, name, exc, delay
            )
            self.queue.add_after(key, delay)
            return
        self._failures.pop(key, None)
        if ready is False:
            self.queue.add_after(key, self.not_ready_recheck_s)

    async def _visit(self, namespace: str, name: str) -> bool | None:
        """One visit. Returns whether the graph is Ready (None: nothing to wait for)."""
        raw = await self.kube.get(DGD, namespace, name)
        if raw is None:
            self._forget((namespace, name))
            return None
        meta = raw["metadata"]
        if meta.get("deletionTimestamp"):
            return None  # the garbage collector removes the children (ownerReferences)
        try:
            dgd = load_graph(raw)  # v1beta1 as stored -> the internal model render works from
        except ValidationError as exc:
            rendered = Rendered(problems=problems_from_validation(exc))
        else:
            rendered = self._render(dgd)
        if rendered.problems:
            await self._report_invalid(raw, rendered)
            return None
        observed_adapters = await adapters.list_adapters(self.kube, raw)
        patched, scaled = await adapters.copy_replicas(self.kube, raw, rendered, observed_adapters)
        if patched is not None:  # the graph now has the replicas HPA, KEDA or kubectl scale asked for
            raw, rendered = patched, self._render(load_graph(patched))
        if rendered.problems:
            await self._report_invalid(raw, rendered)
            return None
        applied, apply_errors = await self._apply_all(raw, rendered)
        if apply_errors:
            cond = Cond(
                READY,
                "False",
                "ApplyFailed",
                "The API server rejected generated objects: " + "; ".join(apply_errors) + ". Check the "
                "fields of spec.services these objects come from (extraPodSpec, resources, labels).",
            )
            if conditions.changed((raw.get("status") or {}).get("conditions") or [], cond):
                await self.kube.post_event(raw, type_="Warning", reason=cond.reason, message=cond.message)
            await self._write_status(raw, rendered, cond, counts=None, state=status.STATE_FAILED)
            raise KubeError(422, "ApplyFailed", "; ".join(apply_errors))
        counts = status.all_counts(
            rendered.services, applied, component_label=labels.COMPONENT, group_label=labels.GROUP
        )
        adapter_warnings = await adapters.sync(self.kube, raw, rendered, observed_adapters, counts, scaled)
        rendered = replace(rendered, notices=rendered.notices + adapter_warnings)
        cond = ready_condition(counts, name)
        if cond.status != "True":  # open readiness gates; say why, when the pods' status states it
            pods = await self.kube.list(POD, namespace, label_selector(labels.graph_selector(name)))
            await open_lora_gates(self.kube, raw, pods)  # before pairing: a pair needs its adapters
            await self._open_gates(raw, rendered, pods)
            problems = status.pod_problems(pods, component_label=labels.COMPONENT)
            cond = ready_condition(counts, name, problems)
        current = raw.get("status") or {}
        if lost_readiness(current.get("conditions") or [], cond):
            # Normal when the user's own change (a new generation) is rolling out; else something broke.
            changed_spec = current.get("observedGeneration") != meta.get("generation")
            await self.kube.post_event(
                raw, type_="Normal" if changed_spec else "Warning", reason=cond.reason, message=cond.message
            )
        state = status.STATE_SUCCESSFUL if cond.status == "True" else status.STATE_PENDING
        await self._write_status(raw, rendered, cond, counts=counts, state=state)
        return cond.status == "True"

    async def _open_gates(self, raw: dict, rendered: Rendered, pods: list[dict]) -> None:
        """Set the readiness gate of the prefill and decode pods whose revision has both roles serving
        (``reconcile.pairing``)."""
        roles = {service: p.role for service, p in rendered.services.items()}
        names = pairing.gates_to_open(pods, roles)
        if not names:
            return
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
                    POD, namespace, pod, pairing.paired_condition(_now()), subresource="status"
                )
            except NotFound:
                continue  # deleted meanwhile
        message = (
            f"Revision {', '.join(revisions)} has prefill and decode pods serving: opened the readiness "
            f"gate of {len(names)} pod(s) ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
        )
        logger.info("%s graph=%s/%s", message, namespace, raw["metadata"]["name"])
        await self.kube.post_event(raw, type_="Normal", reason="RevisionPaired", message=message)

    def _render(self, dgd: DynamoGraphDeployment) -> Rendered:
        """Render; a crash of the renderer (a bug) is reported on the graph instead of retried hot."""
        try:
            return render(dgd, self.config)
        except Exception as exc:  # mapped to a condition + Event, and logged with the traceback
            logger.exception("Render failed graph=%s/%s", dgd.namespace, dgd.name)
            message = (
                f"The operator could not render this graph ({type(exc).__name__}: {exc}). This is a bug in "
                "the operator: please report it with the manifest; editing the spec retries."
            )
            return Rendered(problems=(Problem(field="spec", reason="RenderFailed", message=message),))

    async def _apply_all(self, raw: dict, rendered: Rendered) -> tuple[list[dict], list[str]]:
        meta = raw["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        types = {t.kind: t for t in PRUNE_TYPES}
        for obj in rendered.objects:
            rt = resource_type(obj["apiVersion"], obj["kind"])
            types.setdefault(rt.kind, rt)
        selector = label_selector(labels.graph_selector(name))
        listed = await asyncio.gather(*(self.kube.list(t, namespace, selector) for t in types.values()))
        observed = [o for items in listed for o in items]
        before = {plan.key(o): o for o in observed}

        async def apply_one(obj: dict) -> dict | str:
            current = before.get(plan.key(obj))
            last = self._applied.get(current["metadata"]["uid"]) if current else None
            if current is not None and not plan.needs_apply(obj, current, last, FIELD_MANAGER):
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
            self._applied[after["metadata"]["uid"]] = plan.fingerprint(obj, after, FIELD_MANAGER)
            outcome = plan.apply_outcome(current, after, FIELD_MANAGER)
            if outcome is not None:
                logger.info(
                    "%s %s name=%s graph=%s/%s",
                    outcome,
                    obj["kind"],
                    obj["metadata"]["name"],
                    namespace,
                    name,
                )
                await self.kube.post_event(
                    raw,
                    type_="Normal",
                    reason=outcome,
                    message=f"{outcome} {obj['kind']} {obj['metadata']['name']}",
                )
            return after

        results = await asyncio.gather(*(apply_one(o) for o in rendered.objects))
        applied = [r for r in results if isinstance(r, dict)]
        errors = [r for r in results if isinstance(r, str)]
        if errors:
            return applied, errors
        prune_types = {t.kind for t in PRUNE_TYPES}
        for obj in plan.to_prune(observed, rendered.objects, uid):
            if obj["kind"] not in prune_types:
                continue
            rt = resource_type(obj["apiVersion"], obj["kind"])
            self._applied.pop(obj["metadata"]["uid"], None)
            if await self.kube.delete(rt, namespace, obj["metadata"]["name"], uid=obj["metadata"]["uid"]):
                logger.info(
                    "Deleted %s name=%s graph=%s/%s", obj["kind"], obj["metadata"]["name"], namespace, name
                )
                await self.kube.post_event(
                    raw,
                    type_="Normal",
                    reason="Deleted",
                    message=f"Deleted {obj['kind']} {obj['metadata']['name']}: no longer in the spec",
                )
        return applied, errors

    async def _report_invalid(self, raw: dict, rendered: Rendered) -> None:
        cond = invalid_condition(rendered.problems)
        current = raw.get("status") or {}
        new_generation = current.get("observedGeneration") != raw["metadata"].get("generation")
        if new_generation or conditions.changed(current.get("conditions") or [], cond):
            for p in rendered.problems:
                logger.warning(
                    "Invalid spec graph=%s field=%s reason=%s", raw["metadata"]["name"], p.field, p.reason
                )
                await self.kube.post_event(
                    raw, type_="Warning", reason=p.reason, message=f"{p.field}: {p.message}"
                )
        await self._write_status(raw, rendered, cond, counts=None, state=status.STATE_FAILED)

    async def _write_status(
        self,
        raw: dict,
        rendered: Rendered,
        ready: Cond,
        *,
        counts: Mapping[str, status.ServiceCounts] | None,
        state: str,
    ) -> None:
        meta = raw["metadata"]
        namespace, name, generation = meta["namespace"], meta["name"], meta.get("generation")
        current = raw.get("status") or {}
        current_conds = current.get("conditions") or []
        new_generation = current.get("observedGeneration") != generation
        wanted = [ready]
        if not rendered.problems:
            wanted.append(warnings_condition(rendered.notices))
            transport = transport_condition(rendered.notices)
            if transport is not None:
                wanted.append(transport)
            if new_generation or any(conditions.changed(current_conds, c) for c in wanted[1:]):
                for n in rendered.notices:
                    if n.warning:
                        logger.warning("%s graph=%s/%s", n.message, namespace, name)
                    await self.kube.post_event(
                        raw, type_="Warning" if n.warning else "Normal", reason=n.reason, message=n.message
                    )
        scaling_cond = scaling.conflict_condition(rendered.scaling_conflicts, rendered.adapters)
        if scaling_cond is not None and not rendered.problems:
            wanted.append(scaling_cond)
            if scaling_cond.status == "True" and conditions.changed(current_conds, scaling_cond):
                await self.kube.post_event(
                    raw, type_="Warning", reason=scaling_cond.reason, message=scaling_cond.message
                )
        if ready.status == "True" and conditions.changed(current_conds, ready):
            await self.kube.post_event(raw, type_="Normal", reason="Ready", message=ready.message)
        new: dict[str, Any] = {
            "state": state,
            "conditions": conditions.merge(current_conds, wanted, now=_now(), generation=generation),
            "observedGeneration": generation,
            "groupBackend": self.config.group_backend,
        }
        if counts is not None:
            new["services"] = status.services_status(counts)
        # lastTransitionTime is kept for unchanged conditions, so equal content means no write.
        patch = status_patch(current, new)
        if patch is None:
            return
        answer = await self.kube.patch_merge(DGD, namespace, name, patch, subresource="status")
        self._own_writes[(namespace, name)] = answer["metadata"]["resourceVersion"]
        logger.info(
            "Updated status graph=%s/%s state=%s ready=%s reason=%s",
            namespace,
            name,
            state,
            ready.status,
            ready.reason,
        )
