"""Prometheus metrics of the frontend, in a registry of its own (served on ``/metrics``)."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["FrontendMetrics", "ModelMetrics", "Tally"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class FrontendMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "dynamo_frontend_requests",
            "Finished requests by model, endpoint and HTTP status.",
            ["model", "endpoint", "status"],
            registry=r,
        )
        self.inflight = Gauge(
            "dynamo_frontend_inflight_requests", "Requests being served.", ["model"], registry=r
        )
        self.ttft = Histogram(
            "dynamo_frontend_time_to_first_token_seconds",
            "Time from request to first output token.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "dynamo_frontend_inter_token_latency_seconds",
            "Time between two output tokens.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "dynamo_frontend_request_duration_seconds",
            "Time from request to its last byte.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.direct_fallbacks = Counter(
            "dynamo_frontend_direct_fallbacks",
            "--router-mode direct: requests this frontend routed itself, by why the endpoint picker's "
            "choice was not served (no_pin: no worker header; stale_worker: the named worker cannot serve).",
            ["model", "reason"],
            registry=r,
        )
        self.input_tokens = Counter("dynamo_frontend_input_tokens", "Prompt tokens.", ["model"], registry=r)
        self.output_tokens = Counter(
            "dynamo_frontend_output_tokens", "Generated tokens.", ["model"], registry=r
        )
        self.cached_tokens = Counter(
            "dynamo_frontend_cached_tokens",
            "Prompt tokens served from a worker's prefix cache.",
            ["model"],
            registry=r,
        )
        self.cached_tokens_host = Counter(
            "dynamo_frontend_cached_tokens_host",
            "Of dynamo_frontend_cached_tokens, those loaded back from host memory or storage (SGLang's "
            "HiCache) rather than found on the GPU.",
            ["model"],
            registry=r,
        )
        self.workers = Gauge(
            "dynamo_frontend_workers",
            "Workers in discovery by model and role.",
            ["model", "role"],
            registry=r,
        )
        self.migrations = Counter(
            "dynamo_frontend_migrations",
            "Streams continued on another worker after theirs was lost (--migration-limit).",
            ["model"],
            registry=r,
        )
        self.queued = Gauge(
            "dynamo_frontend_queued_requests",
            "Requests waiting for a slot of their model's workers, or for a worker of a model scaling "
            "from zero (frontend.admission): the demand a planner or KEDA reads.",
            ["model"],
            registry=r,
        )
        self.queue_rejected = Counter(
            "dynamo_frontend_queue_rejected",
            "Requests refused with 429 because their model's wait queue was full (reason queue_full), "
            "or displaced from it by a request of higher priority (shed).",
            ["model", "reason"],
            registry=r,
        )
        self.queue_expired = Counter(
            "dynamo_frontend_queue_expired",
            "Requests answered 503 when their wait ran out: deadline (no slot freed in time) or "
            "scaling_up (no worker of the model registered in time).",
            ["model", "reason"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "dynamo_frontend_queue_wait_seconds",
            "Time from a request's arrival to its admission to a worker slot.",
            ["model"],
            buckets=(*_LATENCY_BUCKETS, 300.0, 600.0),
            registry=r,
        )
        self.unpaired = Gauge(
            "dynamo_frontend_unpaired_workers",
            "Prefill or decode workers of a revision that has no worker of the other role: they get no "
            "disaggregated traffic (a rollout in progress, or a KV layout mismatch).",
            ["model", "revision", "role"],
            registry=r,
        )
        self.warm_pairs = Gauge(
            "dynamo_frontend_warm_pairs",
            "Prefill/decode worker combinations whose KV transfer connection is open (serving.warmup): "
            "user requests go to these while there is one.",
            ["model"],
            registry=r,
        )
        self.pair_warmups = Counter(
            "dynamo_frontend_pair_warmups",
            "Warm-up requests through new prefill/decode combinations, by outcome (warm, failed).",
            ["model", "outcome"],
            registry=r,
        )
        self.errors = Counter(
            "dynamo_frontend_errors",
            "Errors by type (invalid_request_error, model_not_found, no_workers, "
            "overloaded, upstream_error, client_disconnected, ...).",
            ["type"],
            registry=r,
        )
        self._models: dict[str, ModelMetrics] = {}
        self._finished: dict[tuple[str, str, str], Any] = {}

    def of(self, model: str) -> ModelMetrics:
        """The per-model children a request updates, looked up once per model, not per request."""
        found = self._models.get(model)
        if found is None:
            found = self._models[model] = ModelMetrics(
                inflight=self.inflight.labels(model),
                duration=self.duration.labels(model),
                ttft=self.ttft.labels(model),
                itl=self.itl.labels(model),
                input_tokens=self.input_tokens.labels(model),
                output_tokens=self.output_tokens.labels(model),
                cached_tokens=self.cached_tokens.labels(model),
                cached_tokens_host=self.cached_tokens_host.labels(model),
            )
        return found

    def finished(self, model: str, endpoint: str, status: int | str) -> None:
        """Count a finished request (``requests``)."""
        key = (model, endpoint, str(status))
        child = self._finished.get(key)
        if child is None:
            child = self._finished[key] = self.requests.labels(*key)
        child.inc()


@dataclass(frozen=True)
class ModelMetrics:
    """A model's children of the per-request metrics (``FrontendMetrics.of``)."""

    inflight: Any
    duration: Any
    ttft: Any
    itl: Any
    input_tokens: Any
    output_tokens: Any
    cached_tokens: Any
    cached_tokens_host: Any


class Tally:
    """Observations of one histogram child counted here and added to it in one go (``flush``), the
    same buckets and sum ``observe`` would give. For the event loop's per-token figures: a histogram's
    ``observe`` takes a lock for its sum and another for its bucket, which per streamed token cost the
    frontend more than the bucket search. Flushes itself every ``every`` observations, so a long stream
    shows on ``/metrics`` while it runs."""

    __slots__ = ("_bounds", "_buckets", "_counts", "_every", "_n", "_sum", "_total")

    def __init__(self, child: Any, every: int = 256) -> None:
        # prometheus_client's histogram child: upper bounds (+Inf last), a value per bucket, the sum
        self._bounds: list[float] = child._upper_bounds
        self._buckets, self._sum = child._buckets, child._sum
        self._counts = [0] * len(self._bounds)
        self._total = 0.0
        self._n = 0
        self._every = every

    def observe(self, value: float, times: int = 1) -> None:
        self._counts[bisect_left(self._bounds, value)] += times
        self._total += value * times
        self._n += times
        if self._n >= self._every:
            self.flush()

    def flush(self) -> None:
        if not self._n:
            return
        for bucket, n in zip(self._buckets, self._counts, strict=True):
            if n:
                bucket.inc(n)
        self._sum.inc(self._total)
        self._counts = [0] * len(self._bounds)
        self._total = 0.0
        self._n = 0
