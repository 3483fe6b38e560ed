"""The planner's loop: every adjustment interval, observe, forecast, decide, apply, explain.

I/O only; the deciding is ``step.decide``. Each interval:

1. read the graph (current replicas, GPUs per replica, frontend Services) from its ``GraphSource``: the
   Kubernetes API (``kube.GraphClient``), or a manifest file (``localgraph.LocalGraph``, where Events
   are log lines) — a graph the planner cannot read stops nothing: the step is skipped with a Warning
   Event and ``planner_errors_total{kind}``;
2. scrape the frontends (or query Prometheus) and turn the counters into the interval's traffic;
   sources that fail are named in a Warning Event; with none readable the step is skipped;
3. forecast the next interval, decide, and server-side apply the changed replicas;
4. post an Event (``Scaled`` when replicas changed, else ``PlannerDecision`` at most every
   ``QUIET_EVENTS`` intervals) whose message says why, and update ``planner_*`` metrics.

Scale from zero: while a scaled role is at 0 replicas, the planner looks every ``ZERO_POLL_S`` instead
of every interval, and a frontend holding requests (``dynamo_frontend_queued_requests`` > 0) makes it
give every role one replica at once, without waiting for a whole interval of traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from dynamo_worker.planner.decide import BudgetError, DampenState, check_budget
from dynamo_worker.planner.forecast import Forecaster
from dynamo_worker.planner.kube import KubeError
from dynamo_worker.planner.metrics import PlannerMetrics
from dynamo_worker.planner.observe import (
    Observation,
    ScrapeError,
    Totals,
    interval,
    query_prometheus,
    scrape,
)
from dynamo_worker.planner.settings import PlannerSettings
from dynamo_worker.planner.step import Decision, GraphError, ScaledService, decide, scaled_services
from dynamo_worker.profile.model import Profile, load_profile
from dynamo_worker.runtime.listening import serve

__all__ = ["GraphSource", "Planner", "serve_metrics"]

log = logging.getLogger(__name__)

QUIET_EVENTS = 10  # a decision that changes nothing is reported at most every this many intervals
ZERO_POLL_S = 1.0  # how often the planner looks for demand while a role is at 0 replicas


class GraphSource(Protocol):
    """Where the planner reads its graph (v1alpha1, as the API server answers) and puts its decisions
    and Events: ``kube.GraphClient`` or ``localgraph.LocalGraph``. Failures raise ``KubeError``."""

    async def get_graph(self) -> dict[str, Any]: ...

    async def set_replicas(self, replicas: dict[str, int]) -> None: ...

    async def event(
        self, graph: dict[str, Any], reason: str, message: str, type_: str = "Normal"
    ) -> None: ...


class Planner:
    def __init__(
        self,
        settings: PlannerSettings,
        *,
        ignored_config_fields: list[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.ignored = ignored_config_fields or []
        self.clock = clock
        self.metrics = PlannerMetrics(registry)
        self.metrics.budget.set(settings.max_gpu_budget or 0)
        self.profile: Profile | None = load_profile(settings.profile) if settings.profile else None
        if settings.mode == "sla" and self.profile is None:
            raise ValueError("sla mode needs --profile FILE (python -m dynamo_worker.profile writes one)")
        self.forecaster = Forecaster(settings.load_predictor)
        self.states: dict[str, DampenState] = {}
        self._previous: tuple[float, dict[str, Totals]] | None = None
        self._quiet = 0
        self.decisions = 0
        self.at_zero = False  # a scaled role had 0 replicas at the last step
        self.load_feed: Any = None  # a LoadFeed in load mode (set by the caller)

    # --- observing ---------------------------------------------------------------------------------

    async def _totals(self, http: aiohttp.ClientSession, urls: list[str]) -> tuple[dict[str, Totals], str]:
        s = self.settings
        if s.prometheus_url:
            return {
                s.prometheus_url: await query_prometheus(http, s.prometheus_url, s.prometheus_selector)
            }, ""
        totals, failed = await scrape(http, urls, s.model)
        problem = "; ".join(f"{u}: {why}" for u, why in failed.items())
        return totals, problem

    def _urls(self, discovered: list[str]) -> list[str]:
        given = self.settings.metrics_url
        return [u.strip() for u in given.split(",") if u.strip()] if given else discovered

    # --- one step ----------------------------------------------------------------------------------

    async def step(self, kube: GraphSource, http: aiohttp.ClientSession) -> None:
        """One interval: read the graph, observe the traffic, decide, apply, explain."""
        s = self.settings
        read = await self._read_graph(kube)
        if read is None:
            return
        graph, services, urls = read
        self.at_zero = any(v.replicas == 0 for v in services.values())
        now = self.clock()
        totals = await self._observe(kube, graph, http, urls)
        if not totals:
            return
        observation = self._interval(now, totals)
        demand = any(t.queued > 0 for t in totals.values())
        if observation is None and s.mode == "sla" and not (demand and self.at_zero):
            log.info("First scrape of sources=%s; deciding from the next interval", len(totals))
            return
        decision = decide(
            s,
            services=services,
            forecast=self.forecaster.predict(),
            observation=observation,
            profile=self.profile,
            load_reports=self.load_feed.summary() if self.load_feed is not None else {},
            states=self.states,
            now=now,
            demand=demand,
        )
        self.states = decision.states
        self.decisions += 1
        gpus_used = sum(d.replicas * services[d.role].gpus for d in decision.roles.values())
        if not await self._apply(kube, graph, decision):
            return
        self.metrics.record(observation, decision, gpus_used)
        await self._explain(kube, graph, decision, observation)

    async def _read_graph(
        self, kube: GraphSource
    ) -> tuple[dict[str, Any], dict[str, ScaledService], list[str]] | None:
        """The graph, its scaled services (with the GPU overrides) and the frontends' metrics URLs;
        ``None`` (step skipped, said in a Warning Event) when the graph cannot be read."""
        s = self.settings
        try:
            graph = await kube.get_graph()
            services, discovered = scaled_services(graph, s.roles)
            services = _with_gpu_overrides(s, services)
        except (KubeError, GraphError) as e:
            self.metrics.errors.labels("graph").inc()
            log.warning("Skipped a planning step: %s", e)
            await self._event(kube, {}, "PlannerGraphError", f"Skipped a planning step: {e}", "Warning")
            return None
        return graph, services, self._urls(discovered)

    async def _observe(
        self, kube: GraphSource, graph: dict[str, Any], http: aiohttp.ClientSession, urls: list[str]
    ) -> dict[str, Totals]:
        """The counters of every source that answered; the ones that did not are named in a Warning."""
        try:
            totals, problem = await self._totals(http, urls)
        except (aiohttp.ClientError, TimeoutError, ScrapeError, ValueError, KeyError) as e:
            totals, problem = {}, str(e) or type(e).__name__
        if problem:
            self.metrics.errors.labels("scrape").inc()
            msg = (
                f"Could not read frontend metrics ({problem}); pass --metrics-url or --prometheus-url "
                "if the frontends are elsewhere"
            )
            log.warning(msg)
            await self._event(kube, graph, "MetricsUnavailable", msg, "Warning")
        return totals

    def _interval(self, now: float, totals: dict[str, Totals]) -> Observation | None:
        """The traffic since the last step (fed to the forecaster); ``None`` at the first."""
        observation: Observation | None = None
        if self._previous is not None:
            then, before = self._previous
            observation = interval(before, totals, now - then)
            self.forecaster.observe(
                observation.load, isl_known=observation.isl_known, osl_known=observation.osl_known
            )
        self._previous = (now, totals)
        return observation

    async def _apply(self, kube: GraphSource, graph: dict[str, Any], decision: Decision) -> bool:
        """Set the changed replicas (not in dry-run); False (said in a Warning Event) when that failed."""
        if not decision.changes or self.settings.dry_run:
            return True
        try:
            await kube.set_replicas({d.service: d.replicas for d in decision.roles.values()})
        except KubeError as e:
            self.metrics.errors.labels("patch").inc()
            log.warning("Could not apply a decision: %s", e)
            await self._event(kube, graph, "ScaleFailed", f"{e} (decision: {decision.message()})", "Warning")
            return False
        return True

    async def _explain(
        self, kube: GraphSource, graph: dict[str, Any], decision: Decision, observation: Observation | None
    ) -> None:
        """Count the scalings, log the decision, and post it: ``Scaled`` when replicas changed, else a
        ``PlannerDecision`` every ``QUIET_EVENTS`` intervals."""
        for d in decision.roles.values():
            if d.replicas != d.current:
                self.metrics.scalings.labels(d.role, "up" if d.replicas > d.current else "down").inc()
        message, observed = decision.message(), _observed_text(observation)
        if decision.changes:
            verb = "Would scale" if self.settings.dry_run else "Scaled"
            log.info("%s %s; %s", verb, message, observed)
            await self._event(kube, graph, "Scaled", f"{verb}: {message}; {observed}")
            self._quiet = 0
            return
        self._quiet += 1
        log.info("Decision: %s; %s", message, observed)
        if self._quiet % QUIET_EVENTS == 1:
            await self._event(kube, graph, "PlannerDecision", f"{message}; {observed}")

    async def _event(
        self, kube: GraphSource, graph: dict[str, Any], reason: str, message: str, type_: str = "Normal"
    ) -> None:
        """Post an Event; a failure is logged and counted (planner_errors_total{kind="event"}), never
        fatal: the decision it explains has been made (and logged) already."""
        try:
            await kube.event(graph, reason, message, type_)
        except KubeError as e:
            self.metrics.errors.labels("event").inc()
            log.warning("Could not post Event reason=%s: %s", reason, e)

    # --- running -----------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, kube: GraphSource) -> None:
        s = self.settings
        timeout = aiohttp.ClientTimeout(total=15)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            graph = await kube.get_graph()
            services, _ = scaled_services(graph, s.roles)
            _check_budget(s, services)
            if self.ignored:
                msg = f"Ignored Dynamo planner config fields (no equivalent here): {', '.join(self.ignored)}"
                log.warning(msg)
                await kube.event(graph, "ConfigFieldsIgnored", msg, "Warning")
            await kube.event(
                graph,
                "PlannerStarted",
                f"Planning {', '.join(f'{r} {v.name}' for r, v in services.items())} in {s.mode} mode every "
                f"{s.adjustment_interval_s:g}s (TTFT {s.ttft_ms:g} ms, ITL {s.itl_ms:g} ms, GPU budget "
                f"{s.max_gpu_budget or 'none'}, predictor {s.load_predictor})",
            )
            while not stop.is_set():
                started = self.clock()
                await self.step(kube, http)
                every = min(s.adjustment_interval_s, ZERO_POLL_S) if self.at_zero else s.adjustment_interval_s
                left = every - (self.clock() - started)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=max(left, 0.0))


def _with_gpu_overrides(s: PlannerSettings, services: dict[str, ScaledService]) -> dict[str, ScaledService]:
    return {r: replace(v, gpus=getattr(s, f"{r}_gpus") or v.gpus) for r, v in services.items()}


def _check_budget(s: PlannerSettings, services: dict[str, ScaledService]) -> None:
    gpus = {r: v.gpus for r, v in _with_gpu_overrides(s, services).items()}
    try:
        check_budget(s.max_gpu_budget, gpus, dict.fromkeys(services, max(s.min_replicas, 1)))
    except BudgetError as e:
        raise ValueError(str(e)) from None


def _observed_text(obs: Observation | None) -> str:
    if obs is None:
        return "no interval observed yet"
    parts = [
        f"observed {obs.load.request_rate:.2f} req/s",
        f"ISL {obs.load.isl:.0f}",
        f"OSL {obs.load.osl:.0f}",
    ]
    if obs.ttft_s is not None:
        parts.append(f"TTFT {obs.ttft_s * 1e3:.0f} ms")
    if obs.itl_s is not None:
        parts.append(f"ITL {obs.itl_s * 1e3:.1f} ms")
    return ", ".join(parts)


async def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> tuple[web.AppRunner, int]:
    """``/metrics`` (planner_*) and ``/live``; returns the runner and the bound port (logged)."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def live(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/live", live)
    return await serve(
        app, "planner-metrics", host, port, what="the planner's metrics server", flag="--metrics-port"
    )
