"""Warm pairs: open the KV transfer connection of every new prefill/decode pair before user traffic.

The first KV transfer between a prefill and a decode worker opens their connection, which on GPUs
costs seconds (NIXL's first transfer: 3 s on a warm machine, 12 s on a cold one, against 0.07 s for the
next request). So as soon as discovery lists a prefill and a decode worker of one revision that have
not moved KV between them (a new pod, a new revision), ``PairWarmer`` sends one tiny disaggregated
request through that combination (``Dispatcher.warm_up``), all new combinations at once (at most
``MAX_AT_ONCE`` in flight).
``models.pairing.WarmPairs`` records the outcome, and dispatch keeps user requests on warm combinations
while there is one (``models.pairing.routable_pair``); a user request that got its KV marks its
combination warm too.

Bounded and never in the way: each warm-up has ``timeout_s``; one that fails or runs out is logged as
an error naming the pair and what to check, counted in ``dynamo_frontend_pair_warmups_total``, and
tried again after ``retry_s`` (doubling, at most ``MAX_RETRY_S``) while the pair exists and is not warm.
Until then requests go to the warm combinations, or to any when none is warm.

Readiness: a model is *starting* while its first warm-ups run, it never had a warm combination, and
none of those first warm-ups has ended yet without one (bounded by ``timeout_s``). The frontend's
``/health`` is 503 while a model starts (so dynamo-run's "Ready", which waits for it, comes once the
user's first request takes a warm pair; docs/disaggregated-routing.md says why Kubernetes' Ready condition
does not wait for it); once a model had a warm
pair, or its first round ended, warm-ups (a rollout, a scale-up, a restarted pod) never turn
``/health`` 503: the frontend keeps serving on the warm pairs it has, or on cold ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from dynamo_worker.frontend.metrics import FrontendMetrics
from dynamo_worker.frontend.models.pairing import PairKey, WarmPairs, revisions_newest_first
from dynamo_worker.frontend.models.registry import ModelRegistry
from dynamo_worker.protocol import InstanceRecord
from dynamo_worker.runtime.aio import cancel_and_wait

__all__ = ["PairWarmer"]

log = logging.getLogger(__name__)

RETRY_S = 10.0
MAX_RETRY_S = 300.0
MAX_AT_ONCE = 32  # warm-ups in flight at once (a large graph's hundreds of new pairs queue for a slot)

Send = Callable[[str, InstanceRecord, InstanceRecord], Awaitable[None]]


class PairWarmer:
    """Warms every new prefill/decode combination of a revision; ``changed`` is the registry's listener."""

    def __init__(
        self,
        registry: ModelRegistry,
        warm: WarmPairs,
        send: Send,
        *,
        timeout_s: float,
        retry_s: float = RETRY_S,
        metrics: FrontendMetrics | None = None,
    ) -> None:
        self._registry = registry
        self.warm = warm
        self._send = send
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._metrics = metrics
        self._tasks: dict[PairKey, asyncio.Task[None]] = {}
        self._model_of: dict[PairKey, str] = {}
        self._slots = asyncio.Semaphore(MAX_AT_ONCE)
        self._starting: set[str] = set()  # models whose first warm-ups are on
        self._settled: set[str] = set()  # models that had a warm pair or ended their first round

    def warm_count(self) -> int:
        """Combinations warm now (of every model)."""
        return sum(1 for key in self.warm.pairs() if self.warm.is_warm(*key))

    def starting(self) -> list[str]:
        """Models whose first warm-ups run (``/health`` waits for them, see the module docstring)."""
        return sorted(self._starting)

    def changed(self) -> None:
        """Warm the combinations discovery lists now that were never warmed; forget those that left."""
        wanted: dict[PairKey, tuple[str, InstanceRecord, InstanceRecord]] = {}
        for entry in self._registry.entries():
            for pair in revisions_newest_first(entry.by_role("prefill"), entry.by_role("decode")):
                for p in pair.prefill:
                    for d in pair.decode:
                        wanted[(p.instance_id, d.instance_id)] = (entry.name, p, d)
        for key in [k for k in self.warm.pairs() if k not in wanted]:
            self.warm.forget(key)
            self._model_of.pop(key, None)
            task = self._tasks.pop(key, None)
            if task is not None:
                task.cancel()
        for key, (model, p, d) in wanted.items():
            if self.warm.state(*key) is None:
                self._start(key, model, p, d)
        self._settle()

    def _start(self, key: PairKey, model: str, p: InstanceRecord, d: InstanceRecord) -> None:
        self.warm.set(*key, "warming")
        self._model_of[key] = model
        if model not in self._settled:
            self._starting.add(model)
        self._tasks[key] = asyncio.create_task(self._warm(key, model, p, d), name=f"warm-{key[0]}-{key[1]}")

    async def _warm(self, key: PairKey, model: str, p: InstanceRecord, d: InstanceRecord) -> None:
        delay = self.retry_s
        while self.warm.state(*key) in ("warming", "failed"):
            self.warm.set(*key, "warming")
            started = time.monotonic()
            problem = await self._attempt(model, p, d)
            if self.warm.state(*key) is None:
                return  # the pair left discovery meanwhile
            if problem is None:
                self.warm.set(*key, "warm")
                self._count(model, "warm")
                log.info(
                    "Warmed prefill/decode pair model=%s prefill=%s decode=%s seconds=%.2f",
                    model,
                    p.instance_id,
                    d.instance_id,
                    time.monotonic() - started,
                )
                break
            self.warm.set(*key, "failed")
            self._count(model, "failed")
            log.error(
                "Could not warm prefill/decode pair model=%s prefill=%s (%s) decode=%s (%s): %s. User "
                "requests go to warm pairs meanwhile (to this one only when none is warm, and then pay "
                "for opening its KV transfer connection); retrying in %.0fs. Check both workers' logs "
                "and their KV transfer backend (NIXL/UCX), and that the decode worker reaches the prefill "
                "worker's bootstrap port %s:%s.",
                model,
                p.instance_id,
                p.address,
                d.instance_id,
                d.address,
                problem,
                delay,
                p.bootstrap_host or p.address.rsplit(":", 1)[0],
                p.bootstrap_port,
            )
            self._settle()
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_S)
        self._tasks.pop(key, None)
        self._settle()

    async def _attempt(self, model: str, p: InstanceRecord, d: InstanceRecord) -> str | None:
        """One warm-up request; None when it got its KV through, else why not."""
        try:
            async with self._slots, asyncio.timeout(self.timeout_s):
                await self._send(model, p, d)
        except TimeoutError:
            return f"no answer within {self.timeout_s:.0f}s (--pair-warmup-timeout-s)"
        except asyncio.CancelledError:
            raise
        except Exception as e:  # any failure of the request is the pair's problem, said and retried
            return f"{type(e).__name__}: {getattr(e, 'message', None) or e}"
        return None

    def _settle(self) -> None:
        """A starting model stops blocking readiness once it has a warm pair or no warm-up is pending."""
        for model in list(self._starting):
            states = [self.warm.state(*k) for k, m in self._model_of.items() if m == model]
            if "warm" in states or "warming" not in states:
                self._starting.discard(model)
                self._settled.add(model)
                if "warm" not in states and states:
                    log.error(
                        "No prefill/decode pair of model=%s could be warmed: serving on cold pairs; the "
                        "first requests pay for opening their KV transfer connections",
                        model,
                    )
        if self._metrics is not None:
            for model in {*self._model_of.values()}:
                warm = sum(1 for k, m in self._model_of.items() if m == model and self.warm.is_warm(*k))
                self._metrics.warm_pairs.labels(model).set(warm)

    def _count(self, model: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.pair_warmups.labels(model, outcome).inc()

    async def close(self) -> None:
        await cancel_and_wait(*self._tasks.values())
        self._tasks.clear()
