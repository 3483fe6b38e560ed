"""The readiness gate of a LoRA worker: Ready only once it holds its base model's adapters. Pure.

A prefill, decode or aggregated worker started with ``--enable-lora`` (or ``--lora-paths``) carries the
readiness gate ``LORA_GATE_CONDITION``. The operator sets its condition once the pod holds every adapter
the namespace's ``DynamoModel``s declare for its base model, at once when there are none
(``dynamo_operator.reconcile.lora_gate``). Why: a rolling update removes old pods only as new ones become
Ready, so the old pods keep serving an adapter until the new ones hold it; with the pairing gate
(``render.revision``) a new prefill/decode revision is paired and serving only with its adapters.
"""

from __future__ import annotations

from typing import Any, Final

from dynamo_api.components import Component
from dynamo_api.loras import ADAPTER_ROLES, lora_enabled
from dynamo_api.sglang_args import argv

__all__ = ["LORA_GATE_CONDITION", "lora_gated", "with_lora_gate"]

LORA_GATE_CONDITION: Final = "nvidia.com/dynamo-loras-loaded"


def lora_gated(c: Component) -> bool:
    """Whether ``c``'s pods carry the gate: a language worker serving LoRA adapters."""
    return c.kind == "worker" and c.role in ADAPTER_ROLES and lora_enabled(argv(c.command_view))


def with_lora_gate(spec: dict[str, Any], c: Component) -> dict[str, Any]:
    """``spec`` (a pod spec) with the gate when ``c`` serves LoRA adapters; unchanged otherwise."""
    if not lora_gated(c):
        return spec
    gates = [g for g in spec.get("readinessGates", []) if g.get("conditionType") != LORA_GATE_CONDITION]
    return {**spec, "readinessGates": [*gates, {"conditionType": LORA_GATE_CONDITION}]}
