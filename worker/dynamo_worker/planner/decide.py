"""The planner's decisions, as pure functions: replicas from a forecast and a profile (SLA mode) or from
queue depth and KV usage (load mode), the GPU budget, and dampening. No clock, no I/O: the caller
passes the time and the observations.

SLA mode, per role:

- prefill is compute bound and serves prompts one after another (the mocker and SGLang batch prompts
  up to a token budget, which costs the same time as serving them back to back). A replica is a queue
  with a deterministic service time ``s = ttft(isl)`` from the profile; with Poisson arrivals (M/D/1)
  the mean wait at utilisation ``rho`` is ``rho * s / (2 * (1 - rho))``. Keeping ``s + wait`` within the
  TTFT target gives the highest usable utilisation ``rho_max = 2x / (1 + 2x)`` with
  ``x = target / s - 1``; a replica then carries ``rho_max / s`` requests/s.
- decode is memory bound and batches: at the context a sequence attends to on average
  (``isl + osl / 2``) the largest batch whose profiled ITL is within the ITL target gives a replica's
  capacity, ``batch / itl(batch)`` tokens/s; the load is ``rate * osl`` tokens/s.

Budget (NVIDIA Dynamo's rule): when the replicas ask for more GPUs than the budget, prefill is scaled
down by ``budget / wanted`` (rounded down, at least its minimum) and decode gets what is left (at least
its minimum). A budget smaller than the minimums is refused when the planner starts.

Dampening: scaling up happens at once (a missed SLO costs users); scaling down happens only after the
lower figure has held for ``down_stable_intervals`` decisions in a row and ``cooldown_s`` has passed
since the last change, and then only to the highest figure of those intervals (hysteresis). A role is
never scaled to zero while requests are in flight or arriving.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from dynamo_api.errors import DynamoError

from dynamo_worker.profile.model import Profile

__all__ = [
    "BudgetError",
    "DampenState",
    "Load",
    "RolePlan",
    "SlaPlan",
    "apply_budget",
    "check_budget",
    "dampen",
    "load_replicas",
    "sla_replicas",
]

MAX_UTILISATION = 0.95  # never plan a prefill replica busier than this, however loose the TTFT target


class BudgetError(DynamoError, ValueError):
    """A GPU budget that cannot hold the minimum replicas."""


@dataclass(frozen=True)
class Load:
    """Traffic over an interval (observed) or expected over the next one (forecast)."""

    request_rate: float  # requests/s
    isl: float  # mean input tokens per request
    osl: float  # mean output tokens per request


@dataclass(frozen=True)
class RolePlan:
    replicas: int
    predicted_s: float | None  # predicted TTFT (prefill) or ITL (decode) at these replicas
    capacity: float  # what one replica carries: requests/s (prefill) or tokens/s (decode)
    reachable: bool  # False: the target is below what one lone request gets from the profile
    why: str


@dataclass(frozen=True)
class SlaPlan:
    prefill: RolePlan
    decode: RolePlan


def _mdl_wait(rho: float, service_s: float) -> float:
    return math.inf if rho >= 1 else rho * service_s / (2 * (1 - rho))


def _prefill(load: Load, profile: Profile, ttft_target_s: float) -> RolePlan:
    s = profile.ttft_s(load.isl)
    reachable = s < ttft_target_s
    if reachable:
        x = ttft_target_s / s - 1
        rho_max = min(2 * x / (1 + 2 * x), MAX_UTILISATION)
    else:
        rho_max = 0.5
    capacity = rho_max / s
    replicas = math.ceil(load.request_rate / capacity - 1e-9) if load.request_rate > 0 else 0
    rho = load.request_rate * s / replicas if replicas else 0.0
    predicted = s + _mdl_wait(rho, s)
    why = (
        f"{load.request_rate:.2f} req/s at ISL {load.isl:.0f}: a replica takes {s * 1e3:.0f} ms per "
        f"prompt and carries {capacity:.2f} req/s within TTFT {ttft_target_s * 1e3:.0f} ms"
    )
    if not reachable:
        why += f" (unreachable: a lone prompt takes {s * 1e3:.0f} ms; sized for 50% utilisation)"
    return RolePlan(replicas, predicted, capacity, reachable, why)


def _decode(load: Load, profile: Profile, itl_target_s: float) -> RolePlan:
    context = load.isl + load.osl / 2
    batch = profile.max_batch_within(itl_target_s, context)
    reachable = batch > 0
    batch = max(batch, 1)
    capacity = batch / profile.itl_s(batch, context)  # tokens/s per replica
    tokens_per_s = load.request_rate * load.osl
    replicas = math.ceil(tokens_per_s / capacity - 1e-9) if tokens_per_s > 0 else 0
    predicted = None
    if replicas:
        # Little's law: sequences decoding at once = token rate x ITL; iterate to the fixed point.
        b = float(batch)
        for _ in range(20):
            b = max(tokens_per_s * profile.itl_s(b, context) / replicas, 1.0)
        predicted = profile.itl_s(b, context)
    why = (
        f"{tokens_per_s:.0f} tok/s at context {context:.0f}: a replica decodes up to {batch} sequences "
        f"within ITL {itl_target_s * 1e3:.1f} ms, {capacity:.0f} tok/s"
    )
    if not reachable:
        why += f" (unreachable: one sequence alone gets {profile.itl_s(1, context) * 1e3:.1f} ms)"
    return RolePlan(replicas, predicted, capacity, reachable, why)


def sla_replicas(load: Load, profile: Profile, ttft_target_s: float, itl_target_s: float) -> SlaPlan:
    """Prefill and decode replicas that hold the targets under ``load`` (0 when there is no load;
    minimums are the budget's business)."""
    return SlaPlan(_prefill(load, profile, ttft_target_s), _decode(load, profile, itl_target_s))


def load_replicas(
    current: int,
    *,
    queue_per_worker: float | None,
    kv_usage: float | None,
    queue_up: float = 1.0,
    queue_down: float = 0.1,
    kv_up: float = 0.8,
    kv_down: float = 0.3,
) -> tuple[int, str]:
    """Load mode, one role: one step up when its workers queue (mean waiting requests per worker above
    ``queue_up``) or fill their KV cache (mean usage above ``kv_up``), one step down when both are
    below the low marks, else unchanged. ``None``: no report from that role's workers."""
    if queue_per_worker is None and kv_usage is None:
        return current, "no load reports from its workers"
    q = queue_per_worker or 0.0
    kv = kv_usage or 0.0
    if q > queue_up or kv > kv_up:
        return current + 1, f"queue {q:.2f}/worker (up at {queue_up}), KV usage {kv:.0%} (up at {kv_up:.0%})"
    if q < queue_down and kv < kv_down:
        return max(current - 1, 0), f"queue {q:.2f}/worker, KV usage {kv:.0%}: below the low marks"
    return current, f"queue {q:.2f}/worker, KV usage {kv:.0%}: within the band"


def check_budget(total_gpus: int | None, gpus: Mapping[str, int], minimum: Mapping[str, int]) -> None:
    if total_gpus is None:
        return
    need = sum(gpus[r] * minimum.get(r, 1) for r in gpus)
    if need > total_gpus:
        raise BudgetError(
            f"max GPU budget {total_gpus} cannot hold the minimum replicas ({need} GPUs: "
            + ", ".join(f"{r} {minimum.get(r, 1)} x {gpus[r]}" for r in gpus)
            + "); raise max_gpu_budget or lower min_endpoint"
        )


def apply_budget(
    desired: Mapping[str, int],
    gpus: Mapping[str, int],
    minimum: Mapping[str, int],
    total_gpus: int | None,
) -> tuple[dict[str, int], str | None]:
    """Replicas within the budget, and a note when it cut them. Roles: ``prefill`` and ``decode``
    (others are scaled proportionally like prefill)."""
    out = {r: max(n, minimum.get(r, 1)) for r, n in desired.items()}
    if total_gpus is None:
        return out, None
    wanted = sum(out[r] * gpus[r] for r in out)
    if wanted <= total_gpus:
        return out, None
    scale = total_gpus / wanted
    for r in out:
        if r != "decode":
            out[r] = max(minimum.get(r, 1), math.floor(out[r] * scale))
    if "decode" in out:
        left = total_gpus - sum(out[r] * gpus[r] for r in out if r != "decode")
        out["decode"] = max(minimum.get("decode", 1), min(out["decode"], left // gpus["decode"]))
    note = (
        f"budget {total_gpus} GPUs < {wanted} wanted ("
        + ", ".join(f"{r} {desired[r]}" for r in desired)
        + "): scaled to "
        + ", ".join(f"{r} {out[r]}" for r in out)
    )
    return out, note


@dataclass(frozen=True)
class DampenState:
    """Per role: when it last changed, and the figures it has wanted below its current size."""

    last_change: float | None = None
    lower: tuple[int, ...] = field(default_factory=tuple)


def dampen(
    state: DampenState,
    *,
    current: int,
    desired: int,
    now: float,
    cooldown_s: float,
    down_stable_intervals: int,
    busy: bool,
) -> tuple[int, DampenState, str]:
    """The replicas to set now for one role, the new state, and why. ``busy``: requests are in flight
    or arriving, so the role must keep at least one replica."""
    if busy:
        desired = max(desired, 1)
    if desired > current:
        return desired, DampenState(last_change=now), "scale up at once"
    if desired == current:
        return current, replace(state, lower=()), "steady"
    lower = (*state.lower, desired)[-down_stable_intervals:]
    held = len(lower) >= down_stable_intervals
    cooled = state.last_change is None or now - state.last_change >= cooldown_s
    if held and cooled:
        target = max(lower)
        return target, DampenState(last_change=now), f"lower for {len(lower)} intervals"
    why = f"wants {desired}, waiting: lower for {len(lower)}/{down_stable_intervals} intervals" + (
        "" if cooled else f", cool-down {cooldown_s:.0f}s since the last change"
    )
    return current, replace(state, lower=lower), why
