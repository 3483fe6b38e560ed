"""Which prefill and decode pods get their readiness gate: those whose revision has both roles. Pure.

The prefill and decode pods of a disaggregated graph carry the pair's revision (label) and a readiness
gate (``render.revision``). A pod is Ready only when its containers are ready and the gate's condition
is True; the operator sets it on every pod of a revision that has at least one prefill and one decode
pod whose containers are ready, and that hold their LoRA adapters when they serve any (their LoRA gate,
``render.lora_gate``, is open), so that a new revision is paired with its adapters on both roles (a
multinode group's leader stands for its group: the other members serve nothing by themselves). The
condition is never set back to False: it records that the revision was paired, and a crash of one
role's pods later is the frontend's business (discovery), not a reason to make the other role's pods
unready.

Why: a rolling update removes old pods only as new ones become Ready. With the gate, the first new
prefill pod is not Ready until a new decode pod is serving too (and the other way round), so the old
revision keeps both roles until the new revision has both: at every moment some revision can serve.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dynamo_operator.render import labels
from dynamo_operator.render.lora_gate import LORA_GATE_CONDITION
from dynamo_operator.render.revision import PAIRED_CONDITION, REVISION_LABEL

__all__ = ["gates_to_open", "paired_condition", "waits_for_gate"]


def _condition(pod: Mapping[str, Any], type_: str) -> str | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            status = cond.get("status")
            return status if isinstance(status, str) else None
    return None


def _gates(pod: Mapping[str, Any]) -> list[str]:
    return [g.get("conditionType", "") for g in (pod.get("spec") or {}).get("readinessGates") or []]


def _gated(pod: Mapping[str, Any]) -> bool:
    return PAIRED_CONDITION in _gates(pod)


def waits_for_gate(pod: Mapping[str, Any]) -> bool:
    """A pod with the gate whose condition is not True yet (and that is not being deleted)."""
    meta = pod.get("metadata") or {}
    return _gated(pod) and not meta.get("deletionTimestamp") and _condition(pod, PAIRED_CONDITION) != "True"


def gates_to_open(pods: Iterable[Mapping[str, Any]], roles: Mapping[str, str | None]) -> list[str]:
    """Names of the pods whose gate condition to set True now. ``roles``: service name -> its role."""
    gated = [p for p in pods if _gated(p) and not (p.get("metadata") or {}).get("deletionTimestamp")]
    serving: dict[str, set[str]] = {}
    for pod in gated:
        meta_labels = (pod.get("metadata") or {}).get("labels") or {}
        role = roles.get(meta_labels.get(labels.COMPONENT, ""))
        member = meta_labels.get(labels.MULTINODE_ROLE) == "worker"
        loras = LORA_GATE_CONDITION not in _gates(pod) or _condition(pod, LORA_GATE_CONDITION) == "True"
        if (
            role in ("prefill", "decode")
            and not member
            and loras
            and _condition(pod, "ContainersReady") == "True"
        ):
            serving.setdefault(meta_labels.get(REVISION_LABEL, ""), set()).add(role)
    complete = {rev for rev, have in serving.items() if have == {"prefill", "decode"}}
    return sorted(
        pod["metadata"]["name"]
        for pod in gated
        if ((pod["metadata"].get("labels") or {}).get(REVISION_LABEL, "") in complete)
        and _condition(pod, PAIRED_CONDITION) != "True"
    )


def paired_condition(now: str) -> dict[str, Any]:
    """The status patch that opens a pod's gate (a strategic merge: other conditions are kept)."""
    return {
        "status": {
            "conditions": [
                {
                    "type": PAIRED_CONDITION,
                    "status": "True",
                    "reason": "RevisionPaired",
                    "message": "This pod's revision has a prefill and a decode pod serving",
                    "lastTransitionTime": now,
                }
            ]
        }
    }
