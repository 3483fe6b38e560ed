"""Deciding what to apply, what an apply did, and what to prune. Pure."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

ObjKey = tuple[str, str, str]  # (apiVersion, kind, name)
AppliedFields = tuple[tuple[Any, Any], ...]  # (fieldsV1, time) of each of a manager's Apply entries


def key(obj: dict[str, Any]) -> ObjKey:
    return (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def controlled_by(obj: dict[str, Any], owner_uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("uid") == owner_uid and r.get("controller") for r in refs)


def to_prune(
    observed: Iterable[dict[str, Any]], desired: Iterable[dict[str, Any]], owner_uid: str
) -> list[dict[str, Any]]:
    """Observed children of this owner that the desired state no longer contains (e.g. a removed
    service, or the groups beyond the new replica count). Objects of other owners are never pruned."""
    wanted = {key(o) for o in desired}
    return sorted(
        (o for o in observed if controlled_by(o, owner_uid) and key(o) not in wanted),
        key=key,
    )


def applied_fields(obj: dict[str, Any], manager: str) -> AppliedFields:
    """The fields ``manager`` owns through server-side apply (and when it last changed them)."""
    entries = obj["metadata"].get("managedFields") or []
    return tuple(
        (e.get("fieldsV1"), e.get("time"))
        for e in entries
        if e.get("manager") == manager and e.get("operation") == "Apply"
    )


def apply_outcome(before: dict[str, Any] | None, after: dict[str, Any], manager: str) -> str | None:
    """``Created`` / ``Updated`` / None (unchanged) for a server-side apply by ``manager``, from the
    object before and the answer of the apply. Status-only changes by controllers do not count: only
    a new generation or a change of the fields this manager applies."""
    if before is None:
        return "Created"
    if before["metadata"].get("generation") != after["metadata"].get("generation"):
        return "Updated"
    if applied_fields(before, manager) != applied_fields(after, manager):
        return "Updated"
    return None


def manifest_hash(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# (hash of the applied manifest, the manager's fields after applying it)
Fingerprint = tuple[str, AppliedFields]


def fingerprint(desired: dict[str, Any], applied: dict[str, Any], manager: str) -> Fingerprint:
    return (manifest_hash(desired), applied_fields(applied, manager))


def needs_apply(
    desired: dict[str, Any], observed: dict[str, Any] | None, last: Fingerprint | None, manager: str
) -> bool:
    """Whether ``desired`` must be applied again. It need not when this incarnation of the object
    (same uid) was last applied from the same manifest and still holds exactly the fields that apply
    gave the manager: any edit of those fields by someone else moves their ownership away (server-side
    apply), a deleted object has a new uid, and a changed spec a new hash."""
    if observed is None or last is None:
        return True
    return last != fingerprint(desired, observed, manager)
