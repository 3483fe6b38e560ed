"""``run_peers.py``'s ``trace`` workload: a window of a Mooncake request trace replayed open loop at its
scaled timestamps through a stack, the same prompts for every stack (``tests.bench.trace``: each hash
id a block of 512 token ids drawn from a generator seeded by the id).

``TRACE_FILE`` (default ``shared/traces/mooncake-conversation.jsonl`` in the checkout, else
``/work/shared/traces/...``), ``TRACE_START_S`` (0), ``TRACE_COUNT`` (300 requests) and
``TRACE_SPEEDUPS`` (``1,2,4,8``: each a point, the sweep stopping at the first past the SLO, as the
concurrency sweep does; a point's ``conc`` column is its speedup). Requests whose prompt and output
do not fit the served context are left out (their number is printed and noted on each point).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from tests.bench import trace  # noqa: E402  (standard library only: runs without the test extras)

_CHECKOUT_TRACE = ROOT / "shared" / "traces" / "mooncake-conversation.jsonl"
_MACHINE_TRACE = Path("/work/shared/traces/mooncake-conversation.jsonl")
_DEFAULT_TRACE = _CHECKOUT_TRACE if _CHECKOUT_TRACE.exists() else _MACHINE_TRACE
TRACE_FILE = Path(os.environ.get("TRACE_FILE") or _DEFAULT_TRACE)
TRACE_START_S = float(os.environ.get("TRACE_START_S", 0))
TRACE_COUNT = int(os.environ.get("TRACE_COUNT", 300))
TRACE_SPEEDUPS = [float(s) for s in os.environ.get("TRACE_SPEEDUPS", "1,2,4,8").split(",") if s]

# (start, token stamps, output tokens, cached tokens, host tokens or None): run_peers' request closures
Outcome = tuple[float, list[float], int, int, int | None]
OneFor = Callable[[int], Callable[[list[int]], Awaitable[Outcome]]]  # output length -> a request sender


@dataclass(frozen=True)
class TracePlan:
    window: list[trace.TraceRequest]  # at the trace's own pace (speedup 1)
    prompts: list[list[int]]
    speedups: list[float]
    dropped: int  # requests of the window left out: longer than the context
    cacheable_share: float

    def describe(self) -> str:
        span = self.window[-1].timestamp_ms / 1e3 if self.window else 0.0
        return (
            f"trace: {len(self.window)} requests over {span:.0f}s of trace time (speedups "
            f"{', '.join(f'{s:g}' for s in self.speedups)}), {self.dropped} left out as longer than the "
            f"context; at most {self.cacheable_share:.2f} of prompt tokens cacheable"
        )


def plan(
    requests: Sequence[trace.TraceRequest],
    *,
    count: int = TRACE_COUNT,
    start_s: float = TRACE_START_S,
    speedups: Sequence[float] = tuple(TRACE_SPEEDUPS),
    context: int,
    top: int,
) -> TracePlan:
    """The window (``count`` requests from ``start_s``) less those whose prompt and output exceed
    ``context``, and their prompts of token ids in ``[100, top)``."""
    taken = trace.window(requests, start_s=start_s, count=count)
    fits = [r for r in taken if r.input_length + r.output_length <= context]
    blocks = trace.BlockTokens(100, top)
    prompts = [trace.prompt_ids(r, blocks) for r in fits]
    return TracePlan(fits, prompts, list(speedups), len(taken) - len(fits), trace.cacheable_share(fits))


@dataclass
class Replayed:
    ttft_s: list[float]
    itl_s: list[float | None]  # per request: (last - first token) / (n - 1)
    output_tokens: int
    prompt_tokens: int
    cached_tokens: int
    host_tokens: int
    errors: int
    seconds: float
    first_error: str = ""


async def replay(p: TracePlan, speedup: float, one_for: OneFor) -> Replayed:
    """Every request of the plan sent at its time / ``speedup`` (open loop); what came back."""
    out = Replayed([], [], 0, 0, 0, 0, 0, 0.0)

    async def send(r: trace.TraceRequest, prompt: list[int]) -> None:
        try:
            t0, stamps, n, cached, host = await one_for(r.output_length)(prompt)
        except Exception as e:  # counted and named; the point goes on
            out.errors += 1
            out.first_error = out.first_error or f"{type(e).__name__}: {e}"[:300]
            return
        if stamps:
            out.ttft_s.append(stamps[0] - t0)
            out.itl_s.append(trace.request_itl_s(stamps[0], stamps[-1], n) if len(stamps) > 1 else None)
        out.output_tokens += n
        out.prompt_tokens += len(prompt)
        out.cached_tokens += cached
        out.host_tokens += host or 0

    start = time.perf_counter()
    tasks = []
    for r, prompt in zip(p.window, p.prompts, strict=True):
        delay = start + r.timestamp_ms / 1e3 / speedup - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(r, prompt)))
    await asyncio.gather(*tasks)
    out.seconds = time.perf_counter() - start
    return out


def good_share(r: Replayed, ttft_s: float = trace.TTFT_SLO_S, itl_s: float = trace.ITL_SLO_S) -> float:
    """The share of the plan's requests within both targets, each per request (Dynamo's goodput)."""
    total = len(r.ttft_s) + r.errors
    return trace.goodput(zip(r.ttft_s, r.itl_s, strict=True), ttft_s, itl_s) / total if total else 0.0
