"""What the SGLang worker reads of its engine's load: our ``LoadSnapshot`` from SGLang's per-rank ones
(``snapshot``), and the queues of a disaggregated leg."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dynamo_worker.protocol import Role
from dynamo_worker.runtime.engine import LoadSnapshot

__all__ = ["snapshot"]


def _sum(loads: Sequence[Any], path: str) -> int:
    """The sum over dp ranks of a ``LoadSnapshot`` field (``disaggregation.x`` for nested ones; 0 where
    this SGLang release has no such field)."""
    total = 0
    for load in loads:
        value: Any = load
        for part in path.split("."):
            value = getattr(value, part, None)
        total += int(value or 0)
    return total


_TRANSFER_QUEUES: dict[Role, tuple[str, ...]] = {
    "prefill": ("disaggregation.prefill_bootstrap_queue_reqs", "disaggregation.prefill_inflight_queue_reqs"),
    "decode": ("disaggregation.decode_prealloc_queue_reqs", "disaggregation.decode_transfer_queue_reqs"),
    "agg": (),
}


def snapshot(loads: Sequence[Any], page_size: int, role: Role) -> LoadSnapshot:
    """Our ``LoadSnapshot`` from SGLang's per-rank ones (``get_loads``: what the schedulers last wrote to
    shared memory, after every prefill batch, on idle and every few decode steps; reading it costs the
    scheduler nothing). Queued prefill tokens: the uncached tokens of the waiting queue; a prefill worker
    adds its bootstrap queue, whose requests SGLang matches against its cache only when they leave it,
    so they count whole (``num_total_tokens`` less the tokens in use is every queued token)."""
    queued = _sum(loads, "num_waiting_uncached_tokens")
    if role == "prefill":
        queued = max(queued, _sum(loads, "num_total_tokens") - _sum(loads, "num_used_tokens"))
    prefill, decode = role == "prefill", role == "decode"
    return LoadSnapshot(
        active_blocks=_sum(loads, "num_used_tokens") // page_size,
        total_blocks=_sum(loads, "max_total_num_tokens") // page_size,
        waiting=_sum(loads, "num_waiting_reqs"),
        running=_sum(loads, "num_running_reqs"),
        waiting_prefill_tokens=0 if decode else queued,
        bootstrap_queue=_sum(loads, "disaggregation.prefill_bootstrap_queue_reqs") if prefill else 0,
        prealloc_queue=_sum(loads, "disaggregation.decode_prealloc_queue_reqs") if decode else 0,
        transfer_queue=_sum(
            loads,
            "disaggregation.prefill_inflight_queue_reqs"
            if prefill
            else "disaggregation.decode_transfer_queue_reqs",
        )
        if prefill or decode
        else 0,
    )
