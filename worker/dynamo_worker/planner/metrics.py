"""The planner's Prometheus metrics (``planner_*``), in a registry of its own, served on ``/metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from dynamo_worker.planner.observe import Observation
from dynamo_worker.planner.step import Decision

__all__ = ["PlannerMetrics"]


class PlannerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        by_role = ["role", "service"]
        self.current = Gauge(
            "planner_current_replicas", "Replicas in the graph before the decision.", by_role, registry=r
        )
        self.desired = Gauge(
            "planner_desired_replicas",
            "Replicas the mode asks for (before budget, dampening).",
            by_role,
            registry=r,
        )
        self.applied = Gauge("planner_replicas", "Replicas set by the last decision.", by_role, registry=r)
        self.gpus = Gauge("planner_gpus", "GPUs the scaled roles use after the last decision.", registry=r)
        self.budget = Gauge("planner_gpu_budget", "The GPU budget (0: none).", registry=r)
        self.predicted_ttft = Gauge(
            "planner_predicted_ttft_seconds", "TTFT predicted for the next interval.", registry=r
        )
        self.observed_ttft = Gauge(
            "planner_observed_ttft_seconds", "Mean TTFT over the last interval.", registry=r
        )
        self.predicted_itl = Gauge(
            "planner_predicted_itl_seconds", "ITL predicted for the next interval.", registry=r
        )
        self.observed_itl = Gauge(
            "planner_observed_itl_seconds", "Mean ITL over the last interval.", registry=r
        )
        self.observed_rate = Gauge(
            "planner_observed_request_rate", "Finished requests/s, last interval.", registry=r
        )
        self.forecast_rate = Gauge(
            "planner_forecast_request_rate", "Requests/s forecast for the next interval.", registry=r
        )
        self.observed_isl = Gauge(
            "planner_observed_input_tokens", "Mean input tokens, last interval.", registry=r
        )
        self.observed_osl = Gauge(
            "planner_observed_output_tokens", "Mean output tokens, last interval.", registry=r
        )
        self.scalings = Counter(
            "planner_scalings",
            "Replica changes applied, by role and direction.",
            ["role", "direction"],
            registry=r,
        )
        self.errors = Counter(
            "planner_errors", "Failures, by kind (scrape, graph, patch, event).", ["kind"], registry=r
        )

    def record(self, obs: Observation | None, decision: Decision, gpus_used: int) -> None:
        if obs is not None:
            self.observed_rate.set(obs.load.request_rate)
            self.observed_isl.set(obs.load.isl)
            self.observed_osl.set(obs.load.osl)
            if obs.ttft_s is not None:
                self.observed_ttft.set(obs.ttft_s)
            if obs.itl_s is not None:
                self.observed_itl.set(obs.itl_s)
        if decision.forecast is not None:
            self.forecast_rate.set(decision.forecast.request_rate)
        for d in decision.roles.values():
            labels = (d.role, d.service)
            self.current.labels(*labels).set(d.current)
            self.desired.labels(*labels).set(d.wanted)
            self.applied.labels(*labels).set(d.replicas)
            if d.predicted_s is not None:
                (self.predicted_ttft if d.role == "prefill" else self.predicted_itl).set(d.predicted_s)
        self.gpus.set(gpus_used)
