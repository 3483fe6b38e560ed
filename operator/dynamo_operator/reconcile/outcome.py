"""What one visit of a graph did and found (:class:`Outcome`), the status it writes
(:func:`status_for`) and the Events it is worth (:func:`events_for`). Pure.

Events come on transitions only, so a restart of the operator or a repeated visit does not repeat them:
- each change the visit made (a child created, updated or deleted, a service scaled, a readiness gate
  opened): Normal;
- an invalid spec: one Warning per problem, for a new generation or a new Ready message;
- an object the API server rejected: a Warning when the Ready message is new;
- a Ready graph no longer ready: Normal when the user's own change (a new generation) rolls out,
  else Warning (a pod crashed, a node went away);
- render's notices (warnings and statements such as the transport), for a new generation or when the
  SpecWarnings or Transport condition changed;
- a ScalingConflict that became true: Warning; Ready that became true: Normal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dynamo_api.validation import Problem

from dynamo_operator.reconcile import status
from dynamo_operator.reconcile.conditions import (
    APPLY_FAILED,
    READY,
    Cond,
    changed,
    find,
    merge,
    transport_condition,
    warnings_condition,
)
from dynamo_operator.render.types import Notice

__all__ = ["Change", "Event", "Outcome", "events_for", "lost_readiness", "status_for"]


@dataclass(frozen=True)
class Event:
    """A core/v1 Event to post about the graph."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Change:
    """One thing a visit did to the world, as its Event says it (``Created``: "Created Deployment x")."""

    reason: str
    message: str


def applied(action: str, kind: str, name: str) -> Change:
    """A child created or updated by an apply (``action``: ``plan.apply_outcome``'s answer)."""
    return Change(action, f"{action} {kind} {name}")


def pruned(kind: str, name: str) -> Change:
    return Change("Deleted", f"Deleted {kind} {name}: no longer in the spec")


@dataclass(frozen=True)
class Outcome:
    """The graph's new state after one visit: its Ready condition, what render said, the observed
    counts (None: the visit did not get that far, and status keeps the services it had), and the
    changes made on the way."""

    generation: int | None
    ready: Cond
    state: str
    problems: tuple[Problem, ...] = ()
    notices: tuple[Notice, ...] = ()
    scaling: Cond | None = None  # ScalingConflict (None: no service opts into a scaling adapter)
    counts: Mapping[str, status.ServiceCounts] | None = None
    changes: tuple[Change, ...] = ()

    def stated(self) -> list[Cond]:
        """SpecWarnings and, when render states one, Transport (none for an invalid spec)."""
        if self.problems:
            return []
        transport = transport_condition(self.notices)
        return [warnings_condition(self.notices)] + ([transport] if transport is not None else [])

    def conditions(self) -> list[Cond]:
        scaling = [self.scaling] if self.scaling is not None and not self.problems else []
        return [self.ready, *self.stated(), *scaling]


def lost_readiness(current: list[dict[str, Any]], ready: Cond) -> bool:
    """Whether a Ready graph is no longer ready (e.g. a pod crashed): worth an Event."""
    old = find(current, READY)
    return ready.status != "True" and old is not None and old.get("status") == "True"


def events_for(old: Mapping[str, Any], new: Outcome) -> list[Event]:
    """The Events of the transition from status ``old`` (as read with the graph) to ``new``."""
    current: list[dict[str, Any]] = old.get("conditions") or []
    new_generation = old.get("observedGeneration") != new.generation
    events = [Event("Normal", c.reason, c.message) for c in new.changes]
    if new.problems:
        if new_generation or changed(current, new.ready):
            events += [Event("Warning", p.reason, f"{p.field}: {p.message}") for p in new.problems]
        return events
    events += _not_ready(current, new, new_generation)
    if new_generation or any(changed(current, c) for c in new.stated()):
        events += [Event("Warning" if n.warning else "Normal", n.reason, n.message) for n in new.notices]
    if new.scaling is not None and new.scaling.status == "True" and changed(current, new.scaling):
        events.append(Event("Warning", new.scaling.reason, new.scaling.message))
    if new.ready.status == "True" and changed(current, new.ready):
        events.append(Event("Normal", "Ready", new.ready.message))
    return events


def _not_ready(current: list[dict[str, Any]], new: Outcome, new_generation: bool) -> list[Event]:
    """A rejected object (a new message), or a Ready graph that is no longer ready."""
    if new.ready.reason == APPLY_FAILED:
        return [Event("Warning", new.ready.reason, new.ready.message)] if changed(current, new.ready) else []
    if lost_readiness(current, new.ready):
        return [Event("Normal" if new_generation else "Warning", new.ready.reason, new.ready.message)]
    return []


def status_for(old: Mapping[str, Any], new: Outcome, *, now: str, group_backend: str) -> dict[str, Any]:
    """The graph's status after ``new`` (conditions keep their lastTransitionTime while unchanged)."""
    conditions = merge(old.get("conditions") or [], new.conditions(), now=now, generation=new.generation)
    result: dict[str, Any] = {
        "state": new.state,
        "conditions": conditions,
        "observedGeneration": new.generation,
        "groupBackend": group_backend,
    }
    if new.counts is not None:
        result["services"] = status.services_status(new.counts)
    return result
