"""Prometheus metrics of the endpoint picker, in a registry of its own (served on ``/metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["EppMetrics"]

_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class EppMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "dynamo_epp_decisions",
            "Requests sent on to a frontend, by model and whether workers were named (pinned) or the "
            "frontend routes them itself (unpinned: not a generation endpoint, or a chat with images).",
            ["model", "kind"],
            registry=r,
        )
        self.picks = Counter(
            "dynamo_epp_worker_picks",
            "Requests the picker named a worker for, by model, the worker's role in them (agg, prefill, "
            "decode) and its instance id.",
            ["model", "role", "worker"],
            registry=r,
        )
        self.refusals = Counter(
            "dynamo_epp_refusals",
            "Requests answered by the picker itself (ImmediateResponse), by status and code.",
            ["status", "code"],
            registry=r,
        )
        self.decision_seconds = Histogram(
            "dynamo_epp_decision_seconds",
            "From the whole body to the answer: parse, wait in the queue, tokenize, route.",
            buckets=_BUCKETS,
            registry=r,
        )

    def decided(self, model: str | None, workers: dict[str, str], seconds: float) -> None:
        """A request sent on, with the workers it names by role (empty: unpinned)."""
        self.decisions.labels(model or "", "pinned" if workers else "unpinned").inc()
        for role, worker in workers.items():
            self.picks.labels(model or "", role, worker).inc()
        self.decision_seconds.observe(seconds)

    def refused(self, status: int, code: str | None) -> None:
        self.refusals.labels(str(status), code or "").inc()
