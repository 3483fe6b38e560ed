"""The GPU peers runner's trace workload (``tests/gpu/peers_trace.py``): its plan (the window less the
requests past the served context, token-id prompts equal where hash ids are) and its open-loop replay
through a request sender (each request leaves at its scaled time, its TTFT, per-request ITL and cached
tokens are gathered, a failure is counted and named), without a GPU or a server."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from pathlib import Path

import pytest

from tests.bench import trace

GPU = Path(__file__).resolve().parents[2] / "gpu"
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "mooncake-window.jsonl"


@pytest.fixture(scope="module")
def peers_trace():
    spec = importlib.util.spec_from_file_location("peers_trace", GPU / "peers_trace.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("peers_trace", module)
    spec.loader.exec_module(module)
    return module


def test_plan_leaves_out_requests_past_the_context_and_builds_shared_prompts(peers_trace):
    reqs = trace.load(FIXTURE)
    p = peers_trace.plan(reqs, count=10, start_s=0, speedups=[1, 2], context=5000, top=800)
    kept = [r for r in reqs[:10] if r.input_length + r.output_length <= 5000]
    assert p.window == trace.window(kept) and p.dropped == 10 - len(kept) > 0
    assert [len(x) for x in p.prompts] == [r.input_length for r in p.window]
    assert all(100 <= t < 800 for x in p.prompts for t in x)
    assert p.prompts[0][:512] == p.prompts[1][:512], "both begin with hash id 0"
    assert p.cacheable_share == pytest.approx(trace.cacheable_share(p.window))
    assert f"{p.dropped} left out" in p.describe()


def test_replay_sends_open_loop_at_the_scaled_times_and_gathers_figures(peers_trace):
    reqs = [trace.TraceRequest(t, 600, 5, (1, 2)) for t in (0, 400, 800)]
    p = peers_trace.TracePlan(reqs, [[7] * 600] * 3, [4.0], 0, trace.cacheable_share(reqs))
    sent: list[float] = []

    def one_for(osl: int):
        async def one(prompt: list[int]):
            t0 = time.perf_counter()
            sent.append(t0)
            if len(sent) == 3:
                raise RuntimeError("worker gone")
            await asyncio.sleep(1.0)  # far longer than the gaps: the next request must not wait for it
            return t0, [t0 + 0.05 + 0.01 * i for i in range(osl)], osl, 512, None

        return one

    r = asyncio.run(peers_trace.replay(p, 4.0, one_for))
    # 400 ms of trace at speedup 4: no request leaves before its time, 100 ms after the one before it (a
    # busy host may send a late one right after), and none waits for an earlier one's answer (1 s)
    offsets = [t - sent[0] for t in sent]
    assert all(o >= 0.1 * i - 0.005 for i, o in enumerate(offsets)), offsets
    assert offsets[-1] < 0.9, offsets
    assert r.errors == 1 and "worker gone" in r.first_error
    assert r.ttft_s == pytest.approx([0.05, 0.05]) and r.itl_s == pytest.approx([0.01, 0.01])
    assert (r.output_tokens, r.prompt_tokens, r.cached_tokens) == (10, 1200, 1024)
    assert peers_trace.good_share(r) == pytest.approx(2 / 3)
