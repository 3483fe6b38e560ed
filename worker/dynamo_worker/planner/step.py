"""One planner decision, composed from the pure parts: the graph's scalable services, the forecast, the
replicas each mode wants, the budget, the dampening, and the words that explain it. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dynamo_api import contract
from dynamo_api.components import components
from dynamo_api.errors import DynamoError
from dynamo_api.models import DynamoGraphDeployment, ServiceSpec
from pydantic import ValidationError

from dynamo_worker.planner.decide import (
    DampenState,
    Load,
    apply_budget,
    dampen,
    load_replicas,
    sla_replicas,
)
from dynamo_worker.planner.observe import Observation
from dynamo_worker.planner.settings import PlannerSettings
from dynamo_worker.profile.model import Profile

__all__ = ["Decision", "GraphError", "RoleDecision", "ScaledService", "decide", "scaled_services"]


class GraphError(DynamoError, ValueError):
    """The graph has no service the planner can scale for a role, or one it cannot read."""


@dataclass(frozen=True)
class ScaledService:
    role: str  # prefill | decode
    name: str  # key in spec.services
    replicas: int
    gpus: int  # per replica


def _gpus(spec: ServiceSpec) -> int:
    limit = spec.resources.limits.gpu if spec.resources and spec.resources.limits else None
    try:
        per_pod = math.ceil(float(str(limit))) if limit is not None else 0
    except ValueError:
        per_pod = 0
    return max(per_pod, 1) * spec.node_count


def scaled_services(
    graph: dict[str, Any], roles: tuple[str, ...]
) -> tuple[dict[str, ScaledService], list[str]]:
    """The service of each role, and the frontends' metrics URLs (``<graph>-<service>`` on port 8000).
    Raises ``GraphError`` when a role has no service or more than one."""
    try:
        dgd = DynamoGraphDeployment.model_validate(graph)
    except ValidationError as e:
        raise GraphError(f"the graph does not parse: {e.errors()[0]['msg']}; fix the graph") from e
    out: dict[str, ScaledService] = {}
    comps = components(dgd)
    for role in roles:
        found = [c for c in comps if c.kind == "worker" and c.role == role]
        if len(found) != 1:
            names = ", ".join(c.name for c in found) or "none"
            raise GraphError(
                f"the planner scales one {role} service per graph, found {names}; give the graph exactly one "
                f"service with subComponentType: {role}, or run the planner with --scale for the other role"
            )
        c = found[0]
        out[role] = ScaledService(role, c.name, c.spec.replicas, _gpus(c.spec))
    urls = [
        f"http://{dgd.name}-{c.name.lower()}.{dgd.namespace}.svc:{contract.FRONTEND_PORT}/metrics"
        for c in comps
        if c.kind == "frontend"
    ]
    return out, urls


@dataclass(frozen=True)
class RoleDecision:
    role: str
    service: str
    current: int
    wanted: int  # what the mode asks for (before budget and dampening)
    budgeted: int
    replicas: int  # what to set now
    predicted_s: float | None  # TTFT (prefill) or ITL (decode) predicted at ``replicas``
    why: str


@dataclass(frozen=True)
class Decision:
    roles: dict[str, RoleDecision]
    forecast: Load | None
    budget_note: str | None
    states: dict[str, DampenState] = field(default_factory=dict)

    @property
    def changes(self) -> dict[str, int]:
        return {d.service: d.replicas for d in self.roles.values() if d.replicas != d.current}

    def message(self) -> str:
        parts = []
        for d in self.roles.values():
            arrow = f"{d.current} -> {d.replicas}" if d.replicas != d.current else f"stays {d.current}"
            parts.append(f"{d.role} {d.service} {arrow} (wants {d.wanted}: {d.why})")
        if self.budget_note:
            parts.append(self.budget_note)
        return "; ".join(parts)


def decide(
    settings: PlannerSettings,
    *,
    services: Mapping[str, ScaledService],
    forecast: Load | None,
    observation: Observation | None,
    profile: Profile | None,
    load_reports: Mapping[str, tuple[float | None, float | None]],
    states: Mapping[str, DampenState],
    now: float,
    demand: bool = False,
) -> Decision:
    """``load_reports``: per role, (mean waiting requests per worker, mean KV usage) or Nones.
    ``demand``: a frontend holds requests now (``dynamo_frontend_queued_requests``), also before a
    whole interval was observed: every role gets at least one replica at once (scale from zero)."""
    wanted: dict[str, int] = {}
    why: dict[str, str] = {}
    predicted: dict[str, float | None] = {}
    if settings.mode == "sla" and forecast is not None and profile is not None:
        plan = sla_replicas(forecast, profile, settings.ttft_ms / 1e3, settings.itl_ms / 1e3)
        for role in services:
            rp = getattr(plan, role)
            wanted[role], why[role] = rp.replicas, rp.why
    else:
        for role, s in services.items():
            queue, kv = load_reports.get(role, (None, None))
            wanted[role], why[role] = load_replicas(s.replicas, queue_per_worker=queue, kv_usage=kv)
    minimum = dict.fromkeys(services, settings.min_replicas)
    gpus = {r: s.gpus for r, s in services.items()}
    budgeted, note = apply_budget(wanted, gpus, minimum, settings.max_gpu_budget)
    busy = demand or (
        observation is not None and (observation.inflight > 0 or observation.load.request_rate > 0)
    )
    decisions: dict[str, RoleDecision] = {}
    new_states: dict[str, DampenState] = {}
    for role, s in services.items():
        n, new_states[role], how = dampen(
            states.get(role, DampenState()),
            current=s.replicas,
            desired=budgeted[role],
            now=now,
            cooldown_s=settings.cooldown,
            down_stable_intervals=settings.down_stable_intervals,
            busy=busy,
        )
        if forecast is not None and profile is not None and n and forecast.request_rate > 0:
            predicted[role] = _predicted_at(role, forecast, profile, n)
        decisions[role] = RoleDecision(
            role,
            s.name,
            s.replicas,
            wanted[role],
            budgeted[role],
            n,
            predicted.get(role),
            f"{why[role]}; {how}",
        )
    return Decision(decisions, forecast, note, new_states)


def _predicted_at(role: str, load: Load, profile: Profile, replicas: int) -> float | None:
    """TTFT (prefill) or ITL (decode) predicted for ``load`` on ``replicas`` replicas."""
    if role == "prefill":
        s = profile.ttft_s(load.isl)
        rho = load.request_rate * s / replicas
        return math.inf if rho >= 1 else s + rho * s / (2 * (1 - rho))
    context = load.isl + load.osl / 2
    tokens_per_s = load.request_rate * load.osl
    b = 1.0
    for _ in range(20):
        b = max(tokens_per_s * profile.itl_s(b, context) / replicas, 1.0)
    return profile.itl_s(b, context)
