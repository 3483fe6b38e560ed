"""The per-model wait queue: each model's slots, and what waits for one, in which order, for how long.

Each model has slots (``capacity``): the ``max_running_requests`` its serving workers registered,
summed (the decode workers of the revision requests go to, or the aggregated workers; no bound when one
registered none). A request takes a slot from admission to its last byte (a migration keeps it) and gives
it back when it ends. This frontend counts its own requests only: with several frontends, each may fill
the workers' slots, and the rest waits in the engines.

More: docs/module-notes.md (dynamo_worker.frontend.serving.admission)."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import Histogram

from dynamo_worker.frontend.errors import ApiError, InvalidRequest, ServiceUnavailable, TooManyRequests
from dynamo_worker.frontend.metrics import FrontendMetrics
from dynamo_worker.frontend.models.registry import ModelEntry, ModelRegistry
from dynamo_worker.protocol import InstanceRecord

log = logging.getLogger(__name__)

__all__ = [
    "DROPPED_REASON_HEADER",
    "PRIORITY_HEADER",
    "TTL_HEADER",
    "Admission",
    "Hints",
    "budget",
    "capacity",
    "parse_duration",
    "request_hints",
    "shed_victim",
]

PRIORITY_HEADER = "x-dynamo-request-priority"  # NVIDIA Dynamo's; overrides nvext.agent_hints.priority
TTL_HEADER = "x-llm-d-inference-ttl"  # llm-d's; overrides nvext.request_ttl
DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"  # llm-d's, on every refusal of this module
MAX_TTL_S = 86400.0
SATURATED_RETRY_AFTER_S = 1
SCALING_RETRY_AFTER_S = 5


@dataclass(frozen=True)
class Hints:
    """What a request says about how it may wait: its priority, and how long it may wait at most."""

    priority: int = 0
    ttl_s: float | None = None


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float | None:
    """Seconds from a Go duration (``1.5s``, ``500ms``, ``1m30s``) or a plain number of seconds; None
    when ``text`` is neither."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _ttl(value: float | str, where: str) -> float:
    seconds = parse_duration(value) if isinstance(value, str) else float(value)
    if seconds is None or not math.isfinite(seconds) or not 0 < seconds <= MAX_TTL_S:
        raise InvalidRequest(
            f"Invalid value for {where}: {value!r}. Send how long the request may wait for a worker, as a "
            f"Go duration ('2s', '500ms', '1m30s') or seconds, above 0 and at most {MAX_TTL_S:g}s.",
            param=where if not where.startswith("x-") else None,
            code="invalid_value",
        )
    return seconds


def request_hints(
    headers: Mapping[str, str], priority: int | None = None, ttl: float | str | None = None
) -> Hints:
    """The request's ``Hints``: ``priority`` and ``ttl`` from its body (``nvext``), overridden by the
    headers. Raises ``InvalidRequest`` naming the header or field that is not understood."""
    header_priority = headers.get(PRIORITY_HEADER)
    if header_priority is not None:
        try:
            priority = int(header_priority.strip())
        except ValueError:
            raise InvalidRequest(
                f"Invalid value for header {PRIORITY_HEADER}: {header_priority!r}. Send an integer (higher "
                "is served first; default 0).",
                code="invalid_value",
            ) from None
    header_ttl = headers.get(TTL_HEADER)
    ttl_s = _ttl(header_ttl, TTL_HEADER) if header_ttl is not None else None
    if ttl_s is None and ttl is not None:
        ttl_s = _ttl(ttl, "nvext.request_ttl")
    return Hints(priority=priority or 0, ttl_s=ttl_s)


def _slots(workers: Sequence[InstanceRecord]) -> int | None:
    if any(w.max_running_requests is None for w in workers):
        return None
    return sum(w.max_running_requests or 0 for w in workers)


def capacity(entry: ModelEntry) -> int | None:
    """Requests of ``entry`` that its workers run at once (None: no bound): the decode workers of the
    revision disaggregated requests go to, else the aggregated workers. None too for workers that cannot
    serve a request (dispatch answers why)."""
    pair = entry.pair()
    if pair is not None:
        return _slots(pair.decode)
    agg = entry.by_role("agg")
    return _slots(agg) if agg else None


def budget(
    arrived: float,
    served_since: float | None,
    ttl_deadline: float | None,
    *,
    queue_ttl_s: float,
    scale_up_timeout_s: float,
) -> tuple[float, str]:
    """When a waiting request is answered if no slot frees for it, and with which code:
    ``model_scaling_up`` while its model is not served (``served_since`` None), else ``queue_timeout``."""
    if served_since is None:
        deadline, code = arrived + scale_up_timeout_s, "model_scaling_up"
    else:
        deadline, code = max(arrived, served_since) + queue_ttl_s, "queue_timeout"
    if ttl_deadline is not None:
        deadline = min(deadline, ttl_deadline)
    return deadline, code


@dataclass(eq=False)
class _Waiter:
    model: str
    priority: int
    seq: int
    arrived: float
    ttl_deadline: float | None
    future: asyncio.Future[None]
    timer: asyncio.TimerHandle | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (-self.priority, self.seq)


def shed_victim(waiting: Sequence[_Waiter], priority: int) -> _Waiter | None:
    """The waiter a request of ``priority`` displaces from a full queue: the lowest-priority one, the
    newest of those, when it ranks below ``priority``; else None (the newcomer is refused)."""
    if not waiting:
        return None
    last = waiting[-1]  # the queue is sorted by (-priority, arrival): the last is lowest, newest
    return last if last.priority < priority else None


@dataclass
class _Queue:
    wait_metric: Histogram  # the model's queue-wait histogram (labels looked up once)
    waiting: list[_Waiter] = field(default_factory=list)
    inflight: int = 0
    served_since: float | None = None


class _Slot:
    """The context manager of ``Admission.slot`` (a class: it is entered once per request)."""

    __slots__ = ("admission", "hints", "model")

    def __init__(self, admission: Admission, model: str, hints: Hints) -> None:
        self.admission, self.model, self.hints = admission, model, hints

    async def __aenter__(self) -> None:
        await self.admission._enter(self.model, self.hints)

    async def __aexit__(self, *exc: object) -> None:
        self.admission._leave(self.model)


class Admission:
    """The per-model slots and wait queues (see the module docstring)."""

    def __init__(
        self,
        registry: ModelRegistry,
        metrics: FrontendMetrics,
        *,
        max_queued: int,
        queue_ttl_s: float,
        scale_up_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.metrics = metrics
        self.max_queued = max_queued
        self.queue_ttl_s = queue_ttl_s
        self.scale_up_timeout_s = scale_up_timeout_s
        self._clock = clock
        self._queues: dict[str, _Queue] = {}
        self._seq = itertools.count()
        registry.add_listener(self._pump_all)

    def waiting(self, model: str) -> int:
        q = self._queues.get(model)
        return len(q.waiting) if q is not None else 0

    def inflight(self, model: str) -> int:
        q = self._queues.get(model)
        return q.inflight if q is not None else 0

    def slot(self, model: str, hints: Hints) -> _Slot:
        """``async with admission.slot(model, hints):`` holds a slot of ``model`` for its body; entering
        waits for one as the module docstring says, or raises the ``ApiError`` that answers the
        request."""
        return _Slot(self, model, hints)

    # --- entering and leaving -----------------------------------------------------------------------

    async def _enter(self, model: str, hints: Hints) -> None:
        arrived = self._clock()
        ready = self.registry.admissible(model)  # raises for a model nobody serves nor keeps
        q = self._queues.get(model)
        if q is None:
            q = self._queues[model] = _Queue(self.metrics.queue_wait.labels(model))
        self._note_regime(model, q, ready)
        if ready and not q.waiting and self._free(model, q):
            q.inflight += 1
            q.wait_metric.observe(0.0)
            return
        if len(q.waiting) >= self.max_queued:
            victim = shed_victim(q.waiting, hints.priority)
            if victim is None:
                self.metrics.queue_rejected.labels(model, "queue_full").inc()
                raise self._full(model, q, shed=False, ready=ready)
            self._drop(q, victim)
            self.metrics.queue_rejected.labels(model, "shed").inc()
            victim.future.set_exception(self._full(model, q, shed=True, ready=ready))
        loop = asyncio.get_running_loop()
        ttl_deadline = arrived + hints.ttl_s if hints.ttl_s is not None else None
        w = _Waiter(model, hints.priority, next(self._seq), arrived, ttl_deadline, loop.create_future())
        bisect.insort(q.waiting, w, key=lambda x: x.key)
        self.metrics.queued.labels(model).inc()
        self._arm(q, w)
        if not ready and len(q.waiting) == 1:  # once per wait, not per request
            log.info("Holding requests until a worker can serve them model=%s", model)
        self._pump(model)
        try:
            await w.future
        except asyncio.CancelledError:  # the client went away while it waited
            if w in q.waiting:
                self._drop(q, w)
            elif w.future.done() and not w.future.cancelled() and w.future.exception() is None:
                self._leave(model)  # admitted in the same turn as the cancellation: give the slot back
            raise
        q.wait_metric.observe(self._clock() - arrived)

    def _leave(self, model: str) -> None:
        q = self._queues.get(model)
        if q is None:
            return
        q.inflight = max(q.inflight - 1, 0)
        if q.waiting:  # otherwise nothing to admit (regime changes come with registry changes)
            self._pump(model)

    def _free(self, model: str, q: _Queue) -> bool:
        entry = self.registry.get(model)
        if entry is None:
            return False
        cap = capacity(entry)
        return cap is None or q.inflight < cap

    # --- waking waiters -----------------------------------------------------------------------------

    def _pump_all(self) -> None:
        for model in list(self._queues):
            self._pump(model)

    def _pump(self, model: str) -> None:
        """Admit waiters in order while the model is served and has free slots; answer them all when
        their model can no longer be held."""
        q = self._queues.get(model)
        if q is None:
            return
        try:
            ready = self.registry.admissible(model)
        except ApiError as e:
            for w in list(q.waiting):
                self._drop(q, w)
                w.future.set_exception(e)
            ready = False
        self._note_regime(model, q, ready)
        while ready and q.waiting and self._free(model, q):
            w = q.waiting[0]
            self._drop(q, w)
            q.inflight += 1
            w.future.set_result(None)
        if not q.waiting and not q.inflight and q.served_since is None:
            del self._queues[model]

    def _note_regime(self, model: str, q: _Queue, ready: bool) -> None:
        """Track when the model became served again; waiters' budgets follow (``budget``)."""
        if ready == (q.served_since is not None):
            return
        q.served_since = self._clock() if ready else None
        for w in q.waiting:
            self._arm(q, w)

    def _arm(self, q: _Queue, w: _Waiter) -> None:
        if w.timer is not None:
            w.timer.cancel()
        deadline, code = budget(
            w.arrived,
            q.served_since,
            w.ttl_deadline,
            queue_ttl_s=self.queue_ttl_s,
            scale_up_timeout_s=self.scale_up_timeout_s,
        )
        loop = asyncio.get_running_loop()
        delay = max(deadline - self._clock(), 0.0)
        w.timer = loop.call_at(loop.time() + delay, self._expire, q, w, code)

    def _drop(self, q: _Queue, w: _Waiter) -> None:
        q.waiting.remove(w)
        if w.timer is not None:
            w.timer.cancel()
            w.timer = None
        self.metrics.queued.labels(w.model).dec()

    def _expire(self, q: _Queue, w: _Waiter, code: str) -> None:
        if w not in q.waiting or w.future.done():
            return
        self._drop(q, w)
        waited = self._clock() - w.arrived
        reason = "scaling_up" if code == "model_scaling_up" else "deadline"
        self.metrics.queue_expired.labels(w.model, reason).inc()
        if code == "model_scaling_up":
            error: ApiError = ServiceUnavailable(
                f"Model '{w.model}' is scaling up: {self.registry.why_unserved(w.model)}, and none that "
                f"can serve it registered while this request waited ({waited:.1f}s). Retry in a few "
                "seconds; if it persists, check that its workers can start (replicas above 0, the planner "
                "or scaling adapter, the pods' Events).",
                code="model_scaling_up",
                headers={
                    "Retry-After": str(SCALING_RETRY_AFTER_S),
                    DROPPED_REASON_HEADER: "rejected-no-endpoints",
                },
            )
        else:
            error = ServiceUnavailable(
                f"No worker of model '{w.model}' could take this request within its deadline ({waited:.1f}s "
                f"waiting; {q.inflight} requests in flight, {len(q.waiting)} still waiting). Retry later, "
                f"allow a longer wait ({TTL_HEADER}), or add workers.",
                code="queue_timeout",
                headers={
                    "Retry-After": str(SATURATED_RETRY_AFTER_S),
                    DROPPED_REASON_HEADER: "rejected-ttl-expired",
                },
            )
        w.future.set_exception(error)

    def _full(self, model: str, q: _Queue, *, shed: bool, ready: bool) -> ApiError:
        """The refusal at a full queue: 429 while the model is served (its workers are busy, retry), 503
        while it has no worker (it is unavailable, not busy: llm-d's distinction)."""
        why = (
            "a request of higher priority took its place in the model's full queue"
            if shed
            else f"{len(q.waiting)} requests of the model are waiting already, the most this frontend "
            "queues (--max-queued-requests)"
        )
        if not ready:
            return ServiceUnavailable(
                f"Model '{model}' is scaling up and {why}. Retry in a few seconds.",
                code="model_scaling_up",
                headers={
                    "Retry-After": str(SCALING_RETRY_AFTER_S),
                    DROPPED_REASON_HEADER: "rejected-no-endpoints",
                },
            )
        return TooManyRequests(
            f"Model '{model}' is saturated: {why}. Retry later, or send it with a higher priority "
            f"({PRIORITY_HEADER}).",
            code="queue_full",
            headers={
                "Retry-After": str(SATURATED_RETRY_AFTER_S),
                DROPPED_REASON_HEADER: "rejected-saturated",
            },
        )
