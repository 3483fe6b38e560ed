"""Kubernetes-style conditions, and the graph's own: Ready when the spec is invalid or an object was
rejected, SpecWarnings, Transport. Setting one keeps its lastTransitionTime while its status is
unchanged. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dynamo_api.validation import Problem
from pydantic import ValidationError

from dynamo_operator.render.types import Notice

READY = "Ready"
WARNINGS = "SpecWarnings"
TRANSPORT = "Transport"
APPLY_FAILED = "ApplyFailed"


@dataclass(frozen=True)
class Cond:
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str

    def as_dict(self, now: str, generation: int | None) -> dict[str, Any]:
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


def find(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def merge(
    current: list[dict[str, Any]], wanted: list[Cond], *, now: str, generation: int | None
) -> list[dict[str, Any]]:
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


def changed(current: list[dict[str, Any]], cond: Cond) -> bool:
    """Whether setting ``cond`` changes what a person reads (status, reason or message)."""
    old = find(current, cond.type)
    if old is None:
        return True
    return (old.get("status"), old.get("reason"), old.get("message")) != (
        cond.status,
        cond.reason,
        cond.message,
    )


# --- the graph's conditions -------------------------------------------------------------------------


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


def apply_failed_condition(rejections: Sequence[str]) -> Cond:
    """Ready=False naming each generated object the API server rejected (``"<Kind> <name>: why"``)."""
    return Cond(
        READY,
        "False",
        APPLY_FAILED,
        "The API server rejected generated objects: " + "; ".join(rejections) + ". Check the fields of "
        "spec.services these objects come from (extraPodSpec, resources, labels).",
    )


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
