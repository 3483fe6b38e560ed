"""KV routing on one GPU: round-robin vs kv (defaults), two of our SGLang workers sharing GPU 0.

usage: python tests/gpu/run_kv_routing.py          (see tests/gpu/README.md for the device calls)

For each router mode in turn (round-robin first, then kv with the frontend's defaults): an embedded
nats-server, two of our SGLang workers (``python -m dynamo_worker.sglang``, aggregated) on GPU 0, each
with a small ``--mem-fraction-static`` and the same ``--max-total-tokens`` (so the KV cache of one
worker cannot hold every prefix: the router decides what hits), KV events on with a publisher port of
its own, and our frontend with ``--router-mode <mode>``. Fresh workers per mode, so both start cold.
Workload: ``PREFIXES`` shared prefixes of ``PREFIX_LEN`` token ids, each request one of them (drawn at
random, seeded) + ``UNIQUE_LEN`` ids of its own, ``NREQ`` requests streamed through our
``/v1/completions`` at concurrency ``CONC``, ``OSL`` output tokens, greedy, ``ignore_eos``.

Prints the table (cached share of prompt tokens from ``usage.prompt_tokens_details.cached_tokens``,
TTFT p50/p90, req/s) and the kv / round-robin ratios, also in ``$OUT/kv_routing.txt`` and
``$OUT/kv_routing.json``; logs of every process in ``$OUT/logs/``. Says whether issue 20's targets are
met (kv cached share >= 0.80 and TTFT p50 below round-robin's); exits 1 only when requests failed.

``ENGINE=mocker`` runs the same on the simulated engine (no GPU, no SGLang; ``--max-total-tokens``
becomes ``--num-kv-blocks``), which the test suite does with small sizes.

Env: ENGINE (sglang|mocker), PREFIXES (12), PREFIX_LEN (2048), UNIQUE_LEN (64), NREQ (256), CONC (8),
OSL (8), MEM_FRACTION (0.30: the first engine's share of the free GPU memory), KV_SECOND_MEM_FRACTION
(0.43: the second's share of what the first left), MAX_TOTAL_TOKENS (24576, both), STARTUP_S, GRAPHS,
MODES ("round-robin,kv"; one mode per call also works: each mode's result waits in ``$GPU_STATE`` and
the table shows every mode run so far).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run_gpu as g  # noqa: E402  (the GPU proof's process helpers, model folder and flags)

PREFIXES, PREFIX_LEN, UNIQUE_LEN, NREQ, CONC, OSL = (
    int(os.environ.get(k, d))
    for k, d in (
        ("PREFIXES", 12),
        ("PREFIX_LEN", 2048),
        ("UNIQUE_LEN", 64),
        ("NREQ", 256),
        ("CONC", 8),
        ("OSL", 8),
    )
)
MEM_FRACTION = os.environ.get("MEM_FRACTION", "0.30")
# SGLang takes --mem-fraction-static of the memory free when it loads: the second engine (started after
# the first has loaded) takes this share of what is left, about the first one's absolute share.
SECOND_MEM_FRACTION = os.environ.get("KV_SECOND_MEM_FRACTION", "0.43")
MAX_TOTAL_TOKENS = int(os.environ.get("MAX_TOTAL_TOKENS", 24576))
MODES = [m for m in os.environ.get("MODES", "round-robin,kv").split(",") if m]
if set(MODES) - {"round-robin", "kv"}:
    sys.exit(f"MODES={','.join(MODES)}: each mode must be round-robin or kv")
PAGE = 16  # run_gpu.SGLANG_FLAGS' --page-size


@dataclass
class Result:
    mode: str
    requests: int
    errors: int
    cached_share: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    req_per_s: float
    seconds: float


def workload(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(100, 30000) for _ in range(PREFIX_LEN)] for _ in range(PREFIXES)]
    return [
        [*rng.choice(prefixes), *(rng.randrange(100, 30000) for _ in range(UNIQUE_LEN))] for _ in range(NREQ)
    ]


def start_worker(stack: g.Stack, index: int) -> tuple[g.Proc, int]:
    """One aggregated worker on GPU 0 with its own KV events publisher port."""
    system_port = g.free_port()
    module = "dynamo_worker.sglang" if g.ENGINE == "sglang" else "dynamo_worker.mocker"
    events = json.dumps({"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{g.free_port()}"})
    cmd = [sys.executable, "-m", module, "--model-path", str(g.MODEL_DIR), "--served-model-name", g.MODEL,
           "--disaggregation-mode", "null", "--base-gpu-id", "0", "--port", str(g.free_port()),
           *g.SGLANG_FLAGS, "--mem-fraction-static", MEM_FRACTION if index == 0 else SECOND_MEM_FRACTION,
           "--max-total-tokens", str(MAX_TOTAL_TOKENS), "--kv-events-config", events,
           "--namespace", g.NAMESPACE, "--component", "backend",
           "--nats-server", f"nats://127.0.0.1:{stack.nats_port}", "--system-port", str(system_port),
           "--request-port", "0", "--listen-host", "127.0.0.1", "--advertise-host", "127.0.0.1",
           "--graceful-shutdown-s", "5"]  # fmt: skip
    if g.ENGINE == "mocker":
        cmd += ["--vocab-size", "128256", "--eos-probability", "0", "--page-size", str(PAGE),
                "--num-kv-blocks", str(MAX_TOTAL_TOKENS // PAGE)]  # fmt: skip
    return stack._add(f"worker-{index}", cmd), system_port


def start_frontend(stack: g.Stack, mode: str) -> g.Proc:
    cmd = [sys.executable, "-m", "dynamo_worker.frontend", "--http-host", "127.0.0.1",
           "--http-port", str(stack.http_port), "--namespace", g.NAMESPACE,
           "--nats-server", f"nats://127.0.0.1:{stack.nats_port}", "--router-mode", mode]  # fmt: skip
    return stack._add("frontend", cmd)


async def one(session, base: str, ids: list[int]) -> tuple[float, float, int, int]:
    """(ttft s, end s, prompt tokens, cached tokens) of one streamed completion."""
    body = {"model": g.MODEL, "prompt": ids, "max_tokens": OSL, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
    t0 = time.perf_counter()
    first, usage = None, None
    async with session.post(f"{base}/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"our frontend answered {r.status}: {(await r.text())[:200]}")
        async for line in r.content:
            if line.startswith(b"data: {"):
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(f"our frontend's stream failed: {event['error']}")
                if first is None and any(c.get("text") for c in event.get("choices") or ()):
                    first = time.perf_counter() - t0
                usage = event.get("usage") or usage
    if first is None or usage is None:
        raise RuntimeError("the stream ended without output or usage")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return first, time.perf_counter(), usage["prompt_tokens"], cached


async def drive(base: str, requests: list[list[int]], mode: str) -> Result:
    import aiohttp

    queue = list(reversed(requests))
    ttfts: list[float] = []
    prompt = cached = errors = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def sender() -> None:
            nonlocal prompt, cached, errors
            while queue:
                ids = queue.pop()
                try:
                    ttft, _, p, c = await one(session, base, ids)
                except (RuntimeError, aiohttp.ClientError, TimeoutError) as e:
                    errors += 1
                    g.log(f"{mode}: request failed: {e}")
                    continue
                ttfts.append(ttft)
                prompt += p
                cached += c

        start = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(CONC)))
        seconds = time.perf_counter() - start
    return Result(
        mode=mode,
        requests=len(requests),
        errors=errors,
        cached_share=cached / prompt if prompt else 0.0,
        ttft_p50_ms=g.pct(ttfts, 0.5) if ttfts else 0.0,  # g.pct gives milliseconds
        ttft_p90_ms=g.pct(ttfts, 0.9) if ttfts else 0.0,
        req_per_s=len(ttfts) / seconds if seconds else 0.0,
        seconds=seconds,
    )


async def run_mode(mode: str, requests: list[list[int]]) -> Result:
    stack = g.Stack()
    try:
        stack.start_nats()
        for i in range(2):  # one after the other: each engine sizes its memory on a quiet GPU
            proc, system_port = start_worker(stack, i)
            g.wait_http(proc, f"http://127.0.0.1:{system_port}/health")
        frontend = start_frontend(stack, mode)
        g.wait_http(frontend, f"http://127.0.0.1:{stack.http_port}/live", 60)
        base = f"http://127.0.0.1:{stack.http_port}/v1"
        await g.wait_served(base, {"agg"})
        g.log(f"{mode}: {len(requests)} requests at concurrency {CONC}")
        result = await drive(base, requests, mode)
        g.log(f"{mode}: {result}")
        return result
    finally:
        stack.close()


def table(results: list[Result]) -> tuple[str, bool]:
    lines = [
        f"== KV routing on one GPU: ENGINE={g.ENGINE}, 2 workers on GPU 0 (--mem-fraction-static "
        f"{MEM_FRACTION} then {SECOND_MEM_FRACTION}, --max-total-tokens {MAX_TOTAL_TOKENS} each), "
        f"{PREFIXES} prefixes x {PREFIX_LEN} + {UNIQUE_LEN} unique tokens, {NREQ} requests at concurrency "
        f"{CONC}, {OSL} output tokens ==",
        "| router | cached share | TTFT p50 ms | TTFT p90 ms | req/s | errors |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.mode} | {r.cached_share:.3f} | {r.ttft_p50_ms:.1f} | {r.ttft_p90_ms:.1f} | "
            f"{r.req_per_s:.2f} | {r.errors} |"
        )
    by_mode = {r.mode: r for r in results}
    kv, rr = by_mode.get("kv"), by_mode.get("round-robin")
    if kv and rr:

        def ratio(a: float, b: float) -> str:
            return f"{a / b:.2f}x" if b else "-"

        lines.append(
            f"kv / round-robin: cached share {ratio(kv.cached_share, rr.cached_share)}, TTFT p50 "
            f"{ratio(kv.ttft_p50_ms, rr.ttft_p50_ms)}, req/s {ratio(kv.req_per_s, rr.req_per_s)}"
        )
        met = kv.cached_share >= 0.80 and kv.ttft_p50_ms < rr.ttft_p50_ms
        lines.append(
            "issue 20 targets (kv cached share >= 0.80, TTFT p50 below round-robin's): "
            + ("met" if met else "NOT met")
        )
    ok = all(r.errors == 0 for r in results)
    lines.append("RESULT: " + ("PASS" if ok else "FAIL (requests failed)"))
    return "\n".join(lines), ok


def main() -> int:
    # SIGTERM (a time limit) unwinds like an error, so every process gets stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    g.OUT.mkdir(parents=True, exist_ok=True)
    g.STATE.mkdir(parents=True, exist_ok=True)
    g.make_model(g.MODEL_DIR)
    for mode in MODES:
        # different prefixes per mode, drawn alike: neither side can find the other's in a cache
        result = asyncio.run(run_mode(mode, workload(seed=1000 + ("round-robin", "kv").index(mode))))
        (g.STATE / f"kv_routing-{mode}.json").write_text(json.dumps(asdict(result)))
    # modes run by earlier calls (MODES=round-robin, then MODES=kv) join the table
    results = [
        Result(**json.loads(path.read_text()))
        for mode in ("round-robin", "kv")
        if (path := g.STATE / f"kv_routing-{mode}.json").exists()
    ]
    text, ok = table(results)
    (g.OUT / "kv_routing.txt").write_text(text + "\n")
    (g.OUT / "kv_routing.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    print(text, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
