"""Prometheus metrics of the frontend, in a registry of its own (served on ``/metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["FrontendMetrics"]

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
