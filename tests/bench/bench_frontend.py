"""Benchmark (not a test): what the frontend costs, and what kv routing buys.

    .venv/bin/python tests/bench/bench_frontend.py [--requests 400] [--concurrency 16] [--tokens 32]

Starts an embedded nats-server, mocker workers (``python -m dynamo_worker.mocker``) at high speedup and
frontends (``python -m dynamo_worker.frontend``) as separate processes, all on 127.0.0.1, then:

1. Overhead: the same closed-loop workload (fixed concurrency) sent straight to one worker's request
   plane (token ids in, token ids out) and through the frontend (OpenAI chat, SSE, tokenize +
   detokenize). Prints requests/s, mean end-to-end latency and mean time per token for both, the added
   latency per request and per token, and the throughput ratio.
2. Routing: a shared-prefix workload (system prompts x users, shuffled) through a kv frontend and a
   round-robin frontend on the same 3 workers (fresh prefixes for each), printing the cache hit rate
   (cached / prompt tokens from ``usage``) and mean TTFT of each, and their ratios.

Numbers depend on the machine; only the ratios mean something across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
from dynamo_worker.protocol import GenerateRequest, StopConditions
from dynamo_worker.runtime.nats_server import NatsServer, free_port
from dynamo_worker.runtime.request_plane import RequestClient
from dynamo_worker.tinymodel import ensure_tiny_model

MODEL = "tiny"


@dataclass
class Proc:
    proc: subprocess.Popen
    port: int
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_mocker(nats_url: str, ns: str, model_dir: Path, logs: Path, i: int, speedup: float) -> Proc:
    request_port = free_port()
    log = logs / f"mocker-{i}.log"
    args = [
        sys.executable,
        "-m",
        "dynamo_worker.mocker",
        "--model-path",
        str(model_dir),
        "--served-model-name",
        MODEL,
        "--page-size",
        "16",
        "--speedup",
        str(speedup),
        "--namespace",
        ns,
        "--nats-server",
        nats_url,
        "--system-port",
        str(free_port()),
        "--request-port",
        str(request_port),
        "--listen-host",
        "127.0.0.1",
        "--advertise-host",
        "127.0.0.1",
        "--graceful-shutdown-s",
        "1",
        "--max-running-requests",
        "512",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Proc(proc, request_port, log)


def start_frontend(nats_url: str, ns: str, logs: Path, mode: str) -> Proc:
    port = free_port()
    log = logs / f"frontend-{mode}.log"
    args = [
        sys.executable,
        "-m",
        "dynamo_worker.frontend",
        "--http-host",
        "127.0.0.1",
        "--http-port",
        str(port),
        "--namespace",
        ns,
        "--nats-server",
        nats_url,
        "--router-mode",
        mode,
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Proc(proc, port, log)


async def wait_served(session: aiohttp.ClientSession, fe: Proc, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if fe.proc.poll() is not None:
            raise RuntimeError(f"frontend exited:\n{fe.log.read_text()[-2000:]}")
        try:
            async with session.get(f"http://127.0.0.1:{fe.port}/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"frontend not healthy within {within_s}s:\n{fe.log.read_text()[-2000:]}")


async def wait_workers(session: aiohttp.ClientSession, fe: Proc, count: int, within_s: float = 60.0) -> None:
    """Wait until the frontend's ``dynamo_frontend_workers`` gauge counts ``count`` workers."""
    await wait_served(session, fe, within_s)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        async with session.get(f"http://127.0.0.1:{fe.port}/metrics") as r:
            text = await r.text()
        seen = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("dynamo_frontend_workers{")
        )
        if seen >= count:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"frontend did not see {count} workers within {within_s}s")


@dataclass
class Result:
    latencies: list[float]
    ttfts: list[float]
    tokens: int
    cached: int
    prompt: int
    wall: float

    def line(self, name: str) -> str:
        n = len(self.latencies)
        e2e = statistics.mean(self.latencies)
        per_tok = sum(self.latencies) / max(self.tokens, 1)
        return (
            f"{name:<28} {n / self.wall:9.1f} req/s  e2e {e2e * 1000:8.2f} ms  "
            f"per token {per_tok * 1000:7.3f} ms  ttft {statistics.mean(self.ttfts) * 1000:8.2f} ms"
        )


async def closed_loop(n: int, concurrency: int, one) -> Result:
    latencies: list[float] = []
    ttfts: list[float] = []
    totals = {"tokens": 0, "cached": 0, "prompt": 0}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)

    async def worker() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            t0 = time.perf_counter()
            ttft, tokens, cached, prompt = await one(i)
            latencies.append(time.perf_counter() - t0)
            ttfts.append(ttft - t0)
            totals["tokens"] += tokens
            totals["cached"] += cached
            totals["prompt"] += prompt

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Result(
        latencies, ttfts, totals["tokens"], totals["cached"], totals["prompt"], time.perf_counter() - start
    )


async def sse_chat(session: aiohttp.ClientSession, port: int, messages: list, max_tokens: int):
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    ttft = 0.0
    usage = None
    async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
        async for line in r.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            data = orjson.loads(line[6:])
            if not ttft and data.get("choices") and data["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter()
            if data.get("usage"):
                usage = data["usage"]
    assert usage is not None
    return (
        ttft,
        usage["completion_tokens"],
        usage["prompt_tokens_details"]["cached_tokens"],
        usage["prompt_tokens"],
    )


async def overhead(args, session, fe: Proc, worker_port: int) -> None:
    client = RequestClient()
    prompt_ids = list(range(10, 10 + 64))

    async def direct(i: int):
        req = GenerateRequest(
            request_id=f"b{i}",
            model=MODEL,
            token_ids=[i % 7 + 3, *prompt_ids],
            stop=StopConditions(max_tokens=args.tokens, ignore_eos=True),
        )
        ttft, tokens, cached = 0.0, 0, 0
        async for chunk in client.generate(f"127.0.0.1:{worker_port}", req):
            if chunk.token_ids and not ttft:
                ttft = time.perf_counter()
            tokens += len(chunk.token_ids)
            if chunk.usage:
                cached = chunk.usage.cached_tokens
        return ttft, tokens, cached, len(req.token_ids)

    async def through(i: int):
        return await sse_chat(
            session, fe.port, [{"role": "user", "content": f"hello {i % 7} " + "word " * 50}], args.tokens
        )

    await closed_loop(20, 4, direct)  # warm up both paths
    await closed_loop(20, 4, through)
    d = await closed_loop(args.requests, args.concurrency, direct)
    f = await closed_loop(args.requests, args.concurrency, through)
    await client.close()
    print(
        f"\n== frontend overhead (closed loop, concurrency {args.concurrency}, {args.tokens} tokens out) =="
    )
    print(d.line("direct to worker"))
    print(f.line("through frontend"))
    added = statistics.mean(f.latencies) - statistics.mean(d.latencies)
    per_token = sum(f.latencies) / max(f.tokens, 1) - sum(d.latencies) / max(d.tokens, 1)
    print(
        f"added latency per request {added * 1000:.2f} ms, per token {per_token * 1000:.3f} ms; "
        f"throughput ratio frontend/direct {(len(f.latencies) / f.wall) / (len(d.latencies) / d.wall):.2f}"
    )


def shared_prefix_workload(tag: str, systems: int, users: int, words: int) -> list[list[dict]]:
    rng = random.Random(tag)
    vocab = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "robot",
        "paint",
        "story",
        "cache",
        "block",
        "prefix",
        "decode",
        "token",
        "model",
    ]
    convs = []
    for s in range(systems):
        system = f"{tag} system {s}: " + " ".join(rng.choice(vocab) for _ in range(words))
        for u in range(users):
            convs.append(
                [{"role": "system", "content": system}, {"role": "user", "content": f"user {u} asks"}]
            )
    rng.shuffle(convs)
    return convs


async def routing(args, session, kv: Proc, rr: Proc) -> None:
    results = {}
    for name, fe in (("kv", kv), ("round-robin", rr)):
        convs = shared_prefix_workload(name, args.systems, args.users, args.prefix_words)

        async def one(i: int, fe=fe, convs=convs):
            return await sse_chat(session, fe.port, convs[i], 8)

        results[name] = await closed_loop(len(convs), 4, one)
    print(
        f"\n== kv routing vs round-robin ({args.systems} system prompts x {args.users} users, 3 workers) =="
    )
    for name, r in results.items():
        print(
            f"{name:<12} hit rate {r.cached / r.prompt:6.2%}  "
            f"mean ttft {statistics.mean(r.ttfts) * 1000:8.2f} ms  "
            f"p50 ttft {statistics.median(r.ttfts) * 1000:8.2f} ms"
        )
    kvr, rrr = results["kv"], results["round-robin"]
    print(
        f"hit rate ratio kv/rr {(kvr.cached / kvr.prompt) / max(rrr.cached / rrr.prompt, 1e-9):.2f}; "
        f"mean ttft ratio kv/rr {statistics.mean(kvr.ttfts) / statistics.mean(rrr.ttfts):.2f}"
    )


async def main_async(args) -> None:
    procs: list[Proc] = []
    with tempfile.TemporaryDirectory(prefix="bench-frontend-") as tmp, NatsServer() as nats:
        logs = Path(tmp)
        model_dir = ensure_tiny_model(logs / "model")
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                w = start_mocker(nats.url, "bench-overhead", model_dir, logs, 0, args.speedup)
                fe = start_frontend(nats.url, "bench-overhead", logs, "round-robin")
                procs += [w, fe]
                await wait_served(session, fe)
                await overhead(args, session, fe, w.port)

                ws = [
                    start_mocker(nats.url, "bench-routing", model_dir, logs, i + 1, args.routing_speedup)
                    for i in range(3)
                ]
                kv = start_frontend(nats.url, "bench-routing", logs, "kv")
                rr = start_frontend(nats.url, "bench-routing", logs, "round-robin")
                procs += [*ws, kv, rr]
                await wait_workers(session, kv, 3)
                await wait_workers(session, rr, 3)
                await routing(args, session, kv, rr)
        finally:
            for p in reversed(procs):
                p.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400, help="requests per side of the overhead test")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop concurrency")
    parser.add_argument("--tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument("--speedup", type=float, default=1000.0, help="mocker speedup for the overhead test")
    parser.add_argument("--routing-speedup", type=float, default=1.0, help="mocker speedup for routing")
    parser.add_argument("--systems", type=int, default=12, help="system prompts in the routing workload")
    parser.add_argument("--users", type=int, default=4, help="users per system prompt")
    parser.add_argument(
        "--prefix-words", type=int, default=1000, help="words per system prompt (~2.3 tokens each)"
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
