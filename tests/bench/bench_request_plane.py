"""Benchmark (not a test): request-plane round trip and streaming throughput between two local processes.

A child process serves ``RequestServer`` with an engine that streams tokens as fast as it can (one
token per chunk, as the mocker and the SGLang worker do); this process drives it with ``RequestClient``
over one keep-alive session and prints:

- round trip: sequential 1-token requests (latency percentiles and requests/s),
- streaming: one long stream and N concurrent streams (chunks = tokens per second),
- the ratio of concurrent to single-stream throughput.

    .venv/bin/python tests/bench/bench_request_plane.py [--requests 2000] [--tokens 20000] [--streams 8]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

from dynamo_worker.protocol import GenerateChunk, GenerateRequest, StopConditions, Usage
from dynamo_worker.runtime.nats_server import free_port, wait_for_port
from dynamo_worker.runtime.request_plane import RequestClient, RequestServer


async def _fast_engine(req: GenerateRequest):
    n = req.stop.max_tokens
    for i in range(n - 1):
        yield GenerateChunk(token_ids=[i % 1000 + 3])
    yield GenerateChunk(
        token_ids=[7],
        finish_reason="length",
        usage=Usage(prompt_tokens=len(req.token_ids), completion_tokens=n),
    )


async def _serve(port: int) -> None:
    server = RequestServer(_fast_engine, host="127.0.0.1", port=port, max_inflight=4096)
    await server.start()
    await asyncio.Event().wait()


def _request(i: int, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"b{i}",
        model="bench",
        token_ids=list(range(3, 131)),
        stop=StopConditions(max_tokens=max_tokens),
    )


async def _count(client: RequestClient, address: str, i: int, max_tokens: int) -> int:
    tokens = 0
    async for chunk in client.generate(address, _request(i, max_tokens)):
        tokens += len(chunk.token_ids)
    return tokens


async def _drive(address: str, requests: int, tokens: int, streams: int) -> None:
    async with RequestClient(
        connect_timeout_s=5, first_token_timeout_s=30, inter_token_timeout_s=30
    ) as client:
        await _count(client, address, -1, 10)  # warm up the connection
        latencies = []
        t0 = time.perf_counter()
        for i in range(requests):
            t = time.perf_counter()
            await _count(client, address, i, 1)
            latencies.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - t0
        latencies.sort()
        p50 = statistics.median(latencies) * 1e3
        p99 = latencies[int(len(latencies) * 0.99) - 1] * 1e3
        print(
            f"round trip     : {requests} sequential 1-token requests, {requests / elapsed:8.0f} req/s, "
            f"p50 {p50:.2f} ms, p99 {p99:.2f} ms"
        )

        t0 = time.perf_counter()
        got = await _count(client, address, 0, tokens)
        single = got / (time.perf_counter() - t0)
        print(f"stream x1      : {got} tokens, {single:10.0f} tokens/s")

        t0 = time.perf_counter()
        counts = await asyncio.gather(
            *(_count(client, address, i, tokens // streams) for i in range(streams))
        )
        multi = sum(counts) / (time.perf_counter() - t0)
        print(f"stream x{streams:<6} : {sum(counts)} tokens, {multi:10.0f} tokens/s")
        print(f"ratio          : concurrent / single stream = {multi / single:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000, help="sequential round trips")
    parser.add_argument("--tokens", type=int, default=20000, help="tokens per streaming run")
    parser.add_argument("--streams", type=int, default=8, help="concurrent streams")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve))
        return 0
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        wait_for_port("127.0.0.1", port, 30, server)
        print(f"request plane between two processes (server pid {server.pid}, 127.0.0.1:{port})")
        asyncio.run(_drive(f"127.0.0.1:{port}", args.requests, args.tokens, args.streams))
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
