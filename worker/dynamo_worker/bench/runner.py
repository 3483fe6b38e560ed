"""Drive a target with a workload: closed loop (fixed concurrency) or open loop (Poisson arrivals).

- Closed loop: ``concurrency`` senders, each sends its next request when its previous one ends.
- Open loop: requests leave at Poisson arrival times of ``rate`` per second, whether or not earlier
  ones have finished (what a crowd of independent users does; it exposes queueing).

Caps: no request is sent after ``num_requests`` or after ``duration_s``; requests still in flight at
the end get ``drain_s`` more seconds, then are cancelled and reported as ``cancelled``.

A shared-prefix turn waits until its user's previous turn has been answered (its conversation needs
the answer); the clock of a request starts when it is sent, so that wait is not in its latency.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from typing import Literal, Protocol

from dynamo_worker.bench.client import Target
from dynamo_worker.bench.stats import RequestResult
from dynamo_worker.bench.workload import (
    RequestSpec,
    SharedPrefixPlan,
    conversation_messages,
    iter_poisson_arrivals,
    random_prompt,
)

__all__ = ["IteratorWorkload", "SharedPrefixWorkload", "Workload", "run_load"]


class Workload(Protocol):
    async def next(self) -> RequestSpec | None:
        """The next request to send, or None when the workload is exhausted."""

    def done(self, spec: RequestSpec, result: RequestResult) -> None:
        """Called once per request sent, with its outcome."""


class IteratorWorkload:
    """Independent requests from an iterator (e.g. ``workload.random_requests``)."""

    def __init__(self, specs: Iterator[RequestSpec]) -> None:
        self._specs = specs

    async def next(self) -> RequestSpec | None:
        return next(self._specs, None)

    def done(self, spec: RequestSpec, result: RequestResult) -> None:
        return None


class SharedPrefixWorkload:
    """Multi-turn conversations of a ``SharedPrefixPlan``: each turn carries the user's history."""

    def __init__(self, plan: SharedPrefixPlan, seed: int = 0) -> None:
        self.plan = plan
        self._next = 0
        self._history: dict[int, list[tuple[str, str]]] = {}
        self._idle: dict[int, asyncio.Event] = {}
        self._rng = random.Random(seed)

    def _event(self, user: int) -> asyncio.Event:
        if user not in self._idle:
            self._idle[user] = asyncio.Event()
            self._idle[user].set()
        return self._idle[user]

    async def next(self) -> RequestSpec | None:
        if self._next >= len(self.plan.turns):
            return None
        turn = self.plan.turns[self._next]
        self._next += 1
        idle = self._event(turn.user)
        while not idle.is_set():
            await idle.wait()
        idle.clear()
        history = self._history.setdefault(turn.user, [])
        messages = conversation_messages(self.plan.system_prompts[turn.prefix], history, turn.message)
        return RequestSpec(turn.index, messages, turn.max_tokens, turn.input_words, turn.user, turn.turn)

    def done(self, spec: RequestSpec, result: RequestResult) -> None:
        # A failed turn still moves the conversation on, with a stand-in answer of the asked length.
        answer = result.text if result.ok and result.text else random_prompt(self._rng, spec.max_tokens)
        self._history.setdefault(spec.user, []).append((spec.messages[-1]["content"], answer))
        self._event(spec.user).set()


async def run_load(
    target: Target,
    workload: Workload,
    *,
    mode: Literal["closed", "open"] = "closed",
    concurrency: int = 8,
    rate: float = 10.0,
    num_requests: int = 100,
    duration_s: float = 60.0,
    drain_s: float = 30.0,
    seed: int = 0,
) -> list[RequestResult]:
    """Send up to ``num_requests`` within ``duration_s``; the results in the order requests ended."""
    results: list[RequestResult] = []
    t0 = time.perf_counter()
    deadline = t0 + duration_s

    async def send(spec: RequestSpec) -> None:
        start = time.perf_counter()
        result: RequestResult | None = None
        try:
            result = await target.send(spec)
        except asyncio.CancelledError:
            result = RequestResult(
                start=start,
                end=time.perf_counter(),
                error="cancelled",
                error_message=f"still running {drain_s}s after the run's end",
            )
            raise
        except Exception as e:  # a bug in a target must not stop the run: count it as an error type
            result = RequestResult(
                start=start,
                end=time.perf_counter(),
                error="client_error",
                error_message=f"{type(e).__name__}: {e}",
            )
        finally:
            if result is not None:
                results.append(result)
                workload.done(spec, result)

    issued = 0

    async def take() -> RequestSpec | None:
        nonlocal issued
        if issued >= num_requests or time.perf_counter() >= deadline:
            return None
        issued += 1
        return await workload.next()

    tasks: list[asyncio.Task[None]] = []
    if mode == "closed":

        async def sender() -> None:
            while (spec := await take()) is not None:
                await send(spec)

        tasks = [asyncio.create_task(sender()) for _ in range(max(1, concurrency))]
    else:
        for launched, at in enumerate(iter_poisson_arrivals(rate, random.Random(seed))):
            if launched >= num_requests:
                break
            delay = t0 + at - time.perf_counter()
            if t0 + at >= deadline:
                break
            if delay > 0:
                await asyncio.sleep(delay)

            async def one() -> None:
                spec = await take()
                if spec is not None:
                    await send(spec)

            tasks.append(asyncio.create_task(one()))
    if tasks:
        bound = max(0.0, deadline - time.perf_counter()) + drain_s
        _, pending = await asyncio.wait(tasks, timeout=bound)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return results
