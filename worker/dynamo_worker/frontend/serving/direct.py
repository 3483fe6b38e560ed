"""``--router-mode direct``: serve the workers an endpoint picker named (``dynamo_worker.epp``).

Behind a Gateway API gateway the endpoint picker decides, for every frontend replica at once, which
worker serves a request, and names it in request headers (NVIDIA Dynamo's names):
``x-dynamo-worker-instance-id`` (the aggregated or decode worker) and ``x-dynamo-prefill-instance-id``
(the prefill worker of a disaggregated request). The HTTP layer reads them into ``PIN`` (a context
variable of the request's task) and ``Dispatcher.route`` serves them (``pinned_route``).

When the named worker(s) cannot serve the request (the id is unknown to this frontend's discovery, the
worker left or is quarantined after a failure, the model's serving mode does not match what was named,
or the request came with no header at all), the frontend routes it itself (round-robin in direct mode)
and says so: a warning and ``dynamo_frontend_direct_fallbacks_total{reason}``. It does not refuse the
request: the picker's view of discovery trails this frontend's by up to a heartbeat, so a worker that
left between the picker's decision and this frontend is a routine race, and serving it elsewhere is what
migration does for a worker lost mid-stream anyway. A pin serves one attempt: a retry or a migration of
the request goes where the frontend's own router sends it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

from dynamo_worker.frontend.models.registry import ModelEntry
from dynamo_worker.protocol import InstanceRecord, Role
from dynamo_worker.router import Choice

log = logging.getLogger(__name__)

__all__ = [
    "PIN",
    "PREFILL_HEADER",
    "ROUTING_HEADERS",
    "WORKER_HEADER",
    "Pin",
    "pin_from_headers",
    "pinned_choices",
]

WORKER_HEADER = "x-dynamo-worker-instance-id"  # the aggregated or decode worker
PREFILL_HEADER = "x-dynamo-prefill-instance-id"  # the prefill worker of a disaggregated request
ROUTING_HEADERS = (WORKER_HEADER, PREFILL_HEADER)

FallbackHook = Callable[[str, str], None]  # (model, reason)


@dataclass
class Pin:
    """The workers the picker named for one request; ``used`` once an attempt has taken them."""

    worker: str | None
    prefill: str | None = None
    used: bool = False


PIN: ContextVar[Pin | None] = ContextVar("dynamo_direct_pin", default=None)


def pin_from_headers(headers: Mapping[str, str]) -> Pin | None:
    worker = headers.get(WORKER_HEADER, "").strip() or None
    prefill = headers.get(PREFILL_HEADER, "").strip() or None
    if worker is None and prefill is None:
        return None
    return Pin(worker, prefill)


def _find(
    entry: ModelEntry, role: Role, instance_id: str | None, out: frozenset[str]
) -> InstanceRecord | None:
    if instance_id is None or instance_id in out:
        return None
    return next((w for w in entry.by_role(role) if w.instance_id == instance_id), None)


def _choice(record: InstanceRecord, token_ids: Sequence[int], entry: ModelEntry) -> Choice:
    return Choice(record, len(token_ids) // record.page_size, 0, lora_name=entry.lora_name)


def pinned_choices(
    entry: ModelEntry,
    mode: str,
    token_ids: Sequence[int],
    out: frozenset[str],
    on_fallback: FallbackHook | None = None,
) -> tuple[Choice, Choice | None] | None:
    """The pinned (first, decode) choices of this request's first attempt in serving ``mode`` (``agg``:
    decode is None), or None: the frontend routes it itself (said, unless a pin was already used)."""
    pin = PIN.get()
    if pin is not None and pin.used:
        return None  # a retry or migration: the frontend's own choice
    reason = "no_pin"
    if pin is not None:
        pin.used = True
        if mode == "agg":
            agg = _find(entry, "agg", pin.worker, out)
            if agg is not None:
                return _choice(agg, token_ids, entry), None
        else:
            prefill = _find(entry, "prefill", pin.prefill, out)
            decode = _find(entry, "decode", pin.worker, out)
            if prefill is not None and decode is not None:
                return _choice(prefill, token_ids, entry), _choice(decode, token_ids, entry)
        reason = "stale_worker"
    log.warning(
        "Routing a request itself in --router-mode direct model=%s mode=%s reason=%s worker=%s "
        "prefill=%s: %s",
        entry.name,
        mode,
        reason,
        pin.worker if pin else None,
        pin.prefill if pin else None,
        "the request named no worker (did it bypass the gateway's endpoint picker?)"
        if reason == "no_pin"
        else "the named worker(s) are not live serving workers of this model here (left, quarantined, or "
        "of another role)",
    )
    if on_fallback is not None:
        on_fallback(entry.name, reason)
    return None
