"""Kubernetes-style conditions: set one, keeping lastTransitionTime while its status is unchanged. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

READY = "Ready"


@dataclass(frozen=True)
class Cond:
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str

    def as_dict(self, now: str, generation: int | None) -> dict:
        cond: dict[str, Any] = {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": now,
        }
        if generation is not None:
            cond["observedGeneration"] = generation
        return cond


def find(conditions: list[dict], type_: str) -> dict | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def merge(current: list[dict], wanted: list[Cond], *, now: str, generation: int | None) -> list[dict]:
    """The conditions list after setting ``wanted`` (in that order); types not wanted are dropped.

    A condition whose status did not change keeps its lastTransitionTime."""
    result = []
    for cond in wanted:
        new = cond.as_dict(now, generation)
        old = find(current, cond.type)
        if old is not None and old.get("status") == cond.status and old.get("lastTransitionTime"):
            new["lastTransitionTime"] = old["lastTransitionTime"]
        result.append(new)
    return result


def changed(current: list[dict], cond: Cond) -> bool:
    """Whether setting ``cond`` changes what a person reads (status, reason or message)."""
    old = find(current, cond.type)
    if old is None:
        return True
    return (old.get("status"), old.get("reason"), old.get("message")) != (
        cond.status,
        cond.reason,
        cond.message,
    )
