"""What a HiCache host hit saves, on one GPU: the router's --kv-host-hit-weight from a measurement.

usage: python3 tests/gpu/run_hicache.py        (one GPU: GRAPH_GPUS, default the first visible)

``dynamo-run`` of examples/agg-hicache.yaml (SGLang with ``--enable-hierarchical-cache``, our worker,
our frontend), one worker, the user flags of ``run_examples`` (the 8B-shaped dummy model), the GPU's KV
cache cut to ``MAX_TOTAL_TOKENS`` tokens (``--max-total-tokens``) and host memory ``HICACHE_RATIO``
times that, so that a little traffic evicts a prompt from the GPU into host memory. For each prompt
length of ``LENGTHS``, ``REPS`` fresh prompts of token ids, one request at a time (streamed, 2 output
tokens, ``ignore_eos``), each prompt sent three times:

1. a full miss (nothing cached): TTFT_miss;
2. at once again, a GPU hit (the prompt's KV is on the GPU): TTFT_gpu;
3. after other prompts of ``FILL`` x ``MAX_TOTAL_TOKENS`` tokens in all (which evict it from the GPU;
   HiCache keeps its copy in host memory), a host hit (its KV is loaded back over PCIe): TTFT_host.

The worker's own counters (``dynamo_worker_cached_tokens{tier}``) confirm each kind of hit: the
share of the third requests' prompt tokens loaded from host memory is printed (expect about 1).
Per length, the median TTFTs and the weight a host hit deserves against a GPU hit::

    host_weight = (TTFT_miss - TTFT_host) / (TTFT_miss - TTFT_gpu)

(1: a host hit is as good as a GPU hit; 0: as bad as a miss). Writes ``$OUT/hicache.json`` and
``$OUT/hicache.txt``. ``ENGINE=mocker`` runs the same on the simulated engine (its host tier and
load-back time, see dynamo_worker/mocker/timing.py), which the suite does with small sizes.

Env: LENGTHS (1024,4096,8192), REPS (3), MAX_TOTAL_TOKENS (32768), HICACHE_RATIO (4), FILL (1.5),
GRAPH_GPUS, STARTUP_S.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import statistics
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run_examples as ex  # noqa: E402  (the same Graph, flags and model as the user-path proof)

OUT = ex.OUT
LENGTHS = [int(n) for n in os.environ.get("LENGTHS", "1024,4096,8192").split(",") if n]
REPS = int(os.environ.get("REPS", 3))
MAX_TOTAL_TOKENS = int(os.environ.get("MAX_TOTAL_TOKENS", 32768))
HICACHE_RATIO = float(os.environ.get("HICACHE_RATIO", 4))
FILL = float(os.environ.get("FILL", 1.5))
CONTEXT = 16384  # the longest prompt plus its output, above the 8192 of the model's config
EXAMPLE = "examples/agg-hicache.yaml"


@dataclass
class Row:
    length: int
    ttft_miss_ms: float
    ttft_gpu_ms: float
    ttft_host_ms: float
    host_share: float  # of the host-hit requests' prompt tokens, those loaded from host memory
    gpu_share: float  # of the GPU-hit requests' prompt tokens, those found on the GPU
    host_weight: float


def manifest(folder: Path) -> Path:
    """The example with one worker, the user flags, and the cache sizes of this measurement."""
    graph = yaml.safe_load((ex.ROOT / EXAMPLE).read_text())
    for svc in graph["spec"]["services"].values():
        if svc.get("componentType") == "worker":
            svc["replicas"] = 1
            main = svc["extraPodSpec"]["mainContainer"]
            main["args"] = [*main["args"], "--max-total-tokens", str(MAX_TOTAL_TOKENS),
                            "--hicache-ratio", str(HICACHE_RATIO)]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "hicache.yaml"
    path.write_text(yaml.safe_dump(graph, sort_keys=False))
    return ex.user_manifest(str(path), folder)


def cached_tokens(graph: ex.Graph, tier: str) -> float:
    """The worker's ``dynamo_worker_cached_tokens_total{tier=...}``, summed over the graph's processes."""
    total = 0.0
    for port in graph.system_ports():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            continue
        total += sum(
            float(v)
            for v in re.findall(rf'^dynamo_worker_cached_tokens_total{{tier="{tier}"}} (\S+)$', text, re.M)
        )
    return total


async def ttft(session, base: str, model: str, prompt: list[int]) -> float:
    """Seconds to the first streamed token of one completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "stream": True, "ignore_eos": True,
            "temperature": 0}  # fmt: skip
    t0 = time.perf_counter()
    first = None
    async with session.post(f"{base}/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"our frontend answered {r.status}: {(await r.text())[:200]}")
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"our frontend's stream failed: {event['error']}")
            if first is None and any(c.get("text") for c in event.get("choices") or ()):
                first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return first


async def measure(graph: ex.Graph) -> list[Row]:
    import aiohttp

    rng = random.Random(35)
    top = 800 if ex.ENGINE != "sglang" else 30000  # the mocker's tiny tokenizer has 825 ids
    ids = lambda n: [rng.randrange(100, top) for _ in range(n)]  # noqa: E731
    rows = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for _ in range(3):  # warm the path (compilation, first batches): not measured
            await ttft(session, graph.base, graph.model, ids(LENGTHS[0]))
        for length in LENGTHS:
            prompts = [ids(length) for _ in range(REPS)]
            miss = [await ttft(session, graph.base, graph.model, p) for p in prompts]
            gpu_before = cached_tokens(graph, "gpu")
            gpu = [await ttft(session, graph.base, graph.model, p) for p in prompts]
            gpu_share = (cached_tokens(graph, "gpu") - gpu_before) / (REPS * length)
            filled = 0
            while filled < FILL * MAX_TOTAL_TOKENS:  # other traffic: evicts the prompts from the GPU
                await ttft(session, graph.base, graph.model, ids(min(length, 4096)))
                filled += min(length, 4096)
            host_before = cached_tokens(graph, "host")
            host = [await ttft(session, graph.base, graph.model, p) for p in prompts]
            host_share = (cached_tokens(graph, "host") - host_before) / (REPS * length)
            m, g, h = (statistics.median(x) * 1000 for x in (miss, gpu, host))
            row = Row(length, m, g, h, host_share, gpu_share, (m - h) / (m - g) if m > g else float("nan"))
            ex.log(f"{row}")
            rows.append(row)
    return rows


def report(rows: list[Row]) -> str:
    lines = [f"{'length':>7} {'miss ms':>8} {'GPU hit':>8} {'host hit':>8} {'GPU share':>9} "
             f"{'host share':>10} {'host weight':>11}"]  # fmt: skip
    lines += [
        f"{r.length:7d} {r.ttft_miss_ms:8.1f} {r.ttft_gpu_ms:8.1f} {r.ttft_host_ms:8.1f} {r.gpu_share:9.2f} "
        f"{r.host_share:10.2f} {r.host_weight:11.2f}"
        for r in rows
    ]
    weights = [r.host_weight for r in rows if r.host_weight == r.host_weight]
    if weights:
        weight = min(max(statistics.median(weights), 0.0), 1.0)  # the flag's range
        lines.append(f"\n--kv-host-hit-weight from this machine: {weight:.2f} (median over the lengths, "
                     "within 0..1; the default is NVIDIA Dynamo's 0.75)")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if ex.ENGINE == "sglang":
        ex.make_long_model(CONTEXT)
    gpu = ex.gpu_list()[:1]
    graph = ex.Graph("hicache", manifest(OUT / "manifests"), ",".join(gpu))
    try:
        rows = asyncio.run(measure(graph))
    finally:
        graph.stop()
    (OUT / "hicache.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    text = report(rows)
    (OUT / "hicache.txt").write_text(text + "\n")
    print(text)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
