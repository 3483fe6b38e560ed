"""A DynamoModel's endpoints, status and conditions, from what was observed. Pure.

Endpoints are the worker pods that serve the model's base model: every pod of a target service
(``dynamo_api.loras.adapter_services``: prefill, decode and aggregated workers) of a graph in the
model's namespace, that is not being deleted, has an IP, and whose containers are ready (its system port
answers); a multinode group counts once, by its leader (the other ranks serve nothing by themselves).
Old and new pods of a rollout are all endpoints while they exist: each serves until it is gone.

Ready, for a ``lora``/``adapter`` model, is every endpoint holding the adapter (it lists it on
``GET /v1/loras``); for a ``base`` model, that endpoints exist. Reasons: ``AllEndpointsReady``,
``EndpointsDiscovered`` (base), ``NoServicesFound``, ``NoEndpoints``, ``NotReady`` (some endpoint does
not hold it yet), or the reason a worker refused the adapter with (``RankTooLarge``, ``InvalidSource``,
...: ``dynamo_api.loras.REASONS``), whose message names the fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dynamo_api import contract
from dynamo_api.dynamo_model import ENDPOINTS_READY, SERVICES_FOUND, DynamoModel, is_relative_file
from dynamo_api.loras import Refusal, adapter_services
from dynamo_api.models import DynamoGraphDeployment
from dynamo_api.validation import Problem

from dynamo_operator.reconcile.conditions import READY, Cond, changed
from dynamo_operator.reconcile.outcome import Event
from dynamo_operator.render import labels
from dynamo_operator.render.lora_gate import LORA_GATE_CONDITION
from dynamo_operator.render.names import label_value

__all__ = [
    "ALL_READY",
    "DISCOVERED",
    "NOT_READY",
    "NO_ENDPOINTS",
    "NO_SERVICES",
    "Endpoint",
    "ObservedEndpoint",
    "cluster_problems",
    "endpoint_of",
    "endpoints",
    "gate_condition",
    "invalid_conditions",
    "model_conditions",
    "model_events",
    "serving",
    "status_body",
    "targets",
    "waits_for_lora_gate",
]

ALL_READY: Final = "AllEndpointsReady"
DISCOVERED: Final = "EndpointsDiscovered"
NOT_READY: Final = "NotReady"
NO_ENDPOINTS: Final = "NoEndpoints"
NO_SERVICES: Final = "NoServicesFound"
SERVICES: Final = "ServicesFound"
_SHOWN = 3  # pods named in a message, at most


@dataclass(frozen=True)
class Endpoint:
    pod: str
    address: str  # http://<pod IP>:<system port>
    graph: str  # the graph's name label
    service: str


@dataclass(frozen=True)
class ObservedEndpoint:
    """One endpoint as a visit found it: whether it is ready (holds the adapter), and if not, why."""

    endpoint: Endpoint
    ready: bool
    refusal: Refusal | None = None
    unreachable: str | None = None  # no answer from its system port: what happened


def targets(graphs: Iterable[DynamoGraphDeployment], base_model: str) -> dict[str, tuple[str, ...]]:
    """Graph name label -> its services serving ``base_model`` (graphs serving it elsewhere left out)."""
    found = {}
    for dgd in graphs:
        services = tuple(c.name for c in adapter_services(dgd, base_model))
        if services:
            found[label_value(dgd.name)] = services
    return found


def _condition(pod: Mapping[str, Any], type_: str) -> str | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            status = cond.get("status")
            return status if isinstance(status, str) else None
    return None


def _system_port(pod: Mapping[str, Any]) -> int:
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == "main":
            for port in container.get("ports") or []:
                if port.get("name") == "system":
                    return int(port["containerPort"])
    return contract.SYSTEM_PORT


def serving(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    return (
        not meta.get("deletionTimestamp")
        and bool((pod.get("status") or {}).get("podIP"))
        and _condition(pod, "ContainersReady") == "True"
        and (meta.get("labels") or {}).get(labels.MULTINODE_ROLE) != "worker"
    )


def endpoint_of(pod: Mapping[str, Any]) -> Endpoint:
    meta = pod["metadata"]
    pod_labels = meta.get("labels") or {}
    host = pod["status"]["podIP"]
    host = f"[{host}]" if ":" in host else host
    return Endpoint(
        pod=meta["name"],
        address=f"http://{host}:{_system_port(pod)}",
        graph=pod_labels.get(labels.GRAPH, ""),
        service=pod_labels.get(labels.COMPONENT, ""),
    )


def endpoints(pods: Iterable[Mapping[str, Any]], wanted: Mapping[str, Sequence[str]]) -> list[Endpoint]:
    """The serving pods of the ``wanted`` services (graph label -> services), sorted by pod name."""
    found = []
    for pod in pods:
        pod_labels = (pod.get("metadata") or {}).get("labels") or {}
        services = wanted.get(pod_labels.get(labels.GRAPH, ""), ())
        if pod_labels.get(labels.COMPONENT) in services and serving(pod):
            found.append(endpoint_of(pod))
    return sorted(found, key=lambda e: e.pod)


def waits_for_lora_gate(pod: Mapping[str, Any]) -> bool:
    """A serving pod whose LoRA readiness gate (``render.lora_gate``) is not open yet."""
    gates = (pod.get("spec") or {}).get("readinessGates") or []
    gated = any(g.get("conditionType") == LORA_GATE_CONDITION for g in gates)
    return gated and serving(pod) and _condition(pod, LORA_GATE_CONDITION) != "True"


def gate_condition(now: str, adapters: Sequence[str]) -> dict[str, Any]:
    """The pod status patch that opens its LoRA gate (a strategic merge: other conditions are kept)."""
    held = (
        f"holds the adapters of its base model: {', '.join(adapters)}"
        if adapters
        else "has no adapter to load"
    )
    return {
        "status": {
            "conditions": [
                {
                    "type": LORA_GATE_CONDITION,
                    "status": "True",
                    "reason": "LorasLoaded",
                    "message": f"This pod {held}",
                    "lastTransitionTime": now,
                }
            ]
        }
    }


def cluster_problems(dm: DynamoModel) -> tuple[Problem, ...]:
    """What only a cluster cannot do with ``dm``: a ``file://`` path relative to a manifest's folder."""
    source = dm.spec.source
    if dm.spec.loads_adapter and source is not None and is_relative_file(source.uri):
        return (
            Problem(
                "spec.source.uri",
                "RelativeSource",
                f"{source.uri} is relative to the manifest's folder, which only dynamo-run resolves; in a "
                "cluster give an absolute file:///path that the worker pods can read (a volume), or "
                "hf://org/repo or s3://bucket/prefix",
            ),
        )
    return ()


def invalid_conditions(found: Sequence[Problem]) -> list[Cond]:
    reason = found[0].reason if len({p.reason for p in found}) == 1 else "InvalidSpec"
    message = "Invalid spec, nothing was loaded: " + "; ".join(f"{p.field}: {p.message}" for p in found)
    return [Cond(READY, "False", reason, message), Cond(ENDPOINTS_READY, "False", reason, message)]


def _pods(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_SHOWN])
    return shown + (f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def _not_ready(dm: DynamoModel, observed: Sequence[ObservedEndpoint]) -> Cond:
    """EndpointsReady False for a model some endpoints do not hold: the first refusal's reason (by pod
    name) and message, else NotReady naming the pods still loading or unreachable."""
    ready = sum(o.ready for o in observed)
    head = f"{ready}/{len(observed)} endpoints hold adapter {dm.spec.model_name}"
    refused = [o for o in observed if o.refusal is not None]
    if refused:
        first = refused[0]
        assert first.refusal is not None
        pods = _pods([o.endpoint.pod for o in refused if o.refusal == first.refusal])
        others = len({o.refusal for o in refused}) - 1
        more = f" ({others} other refusal(s) in the operator's Events)" if others else ""
        return Cond(
            ENDPOINTS_READY,
            "False",
            first.refusal.reason,
            f"{head}; {pods} refused it: {first.refusal.message}{more}",
        )
    unreachable = [o for o in observed if o.unreachable is not None]
    if unreachable:
        why = unreachable[0].unreachable
        return Cond(
            ENDPOINTS_READY,
            "False",
            NOT_READY,
            f"{head}; no answer from {_pods([o.endpoint.pod for o in unreachable])} ({why}); retrying",
        )
    waiting = _pods([o.endpoint.pod for o in observed if not o.ready])
    return Cond(ENDPOINTS_READY, "False", NOT_READY, f"{head}; loading on {waiting}")


def model_conditions(
    dm: DynamoModel, wanted: Mapping[str, Sequence[str]], observed: Sequence[ObservedEndpoint]
) -> list[Cond]:
    """Ready, EndpointsReady and ServicesFound of ``dm``, from its targets and its observed endpoints."""
    base = dm.spec.base_model_name
    if not wanted:
        message = (
            f"No graph in this namespace serves {base}: none has a prefill, decode or aggregated worker "
            f"whose modelRef.name (else --served-model-name, else --model-path) is {base}. Check "
            "spec.baseModelName, or deploy the graph in this namespace"
        )
        return [
            Cond(READY, "False", NO_SERVICES, message),
            Cond(ENDPOINTS_READY, "False", NO_ENDPOINTS, message),
            Cond(SERVICES_FOUND, "False", NO_SERVICES, message),
        ]
    found = ", ".join(
        f"{graph}/{service}" for graph, services in sorted(wanted.items()) for service in services
    )
    services = Cond(SERVICES_FOUND, "True", SERVICES, f"Found {found} serving {base}")
    if not observed:
        message = f"No worker pod of {found} is serving yet (running with its containers ready)"
        return [
            Cond(READY, "False", NO_ENDPOINTS, message),
            Cond(ENDPOINTS_READY, "False", NO_ENDPOINTS, message),
            services,
        ]
    if not dm.spec.loads_adapter:
        endpoints_cond = Cond(
            ENDPOINTS_READY, "True", DISCOVERED, f"Found {len(observed)} endpoint(s) serving {base}"
        )
    elif all(o.ready for o in observed):
        endpoints_cond = Cond(
            ENDPOINTS_READY,
            "True",
            ALL_READY,
            f"All {len(observed)} endpoint(s) hold adapter {dm.spec.model_name} on {base}",
        )
    else:
        endpoints_cond = _not_ready(dm, observed)
    ready = Cond(READY, endpoints_cond.status, endpoints_cond.reason, endpoints_cond.message)
    return [ready, endpoints_cond, services]


def status_body(observed: Sequence[ObservedEndpoint]) -> dict[str, Any]:
    """``endpoints``, ``readyEndpoints`` and ``totalEndpoints`` of the status (Kubernetes spelling)."""
    return {
        "endpoints": [
            {"address": o.endpoint.address, "podName": o.endpoint.pod, "ready": o.ready} for o in observed
        ],
        "readyEndpoints": sum(o.ready for o in observed),
        "totalEndpoints": len(observed),
    }


def model_events(current: Sequence[Mapping[str, Any]], ready: Cond) -> list[Event]:
    """The Events of a model's new Ready condition, on a transition only: Normal ``EndpointsReady``
    when it became Ready, a Warning with the reason when something refuses it (loading is no news)."""
    if not changed([dict(c) for c in current], ready):
        return []
    if ready.status == "True":
        return [Event("Normal", "EndpointsReady", ready.message)]
    if ready.reason in (NOT_READY, NO_ENDPOINTS):
        return []
    return [Event("Warning", ready.reason, ready.message)]
