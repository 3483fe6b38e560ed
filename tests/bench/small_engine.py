"""A fast engine (issue 48): one mocker with the 1B shape's H200 profile (``builtin:sglang-1b-h200``: a
decode step of about 2 ms, a 2048-token prefill of 8.5 ms), chat-shaped requests (750 words in, about
2048 tokens of the fleet's tokenizer, 256 tokens out) closed-loop at concurrency 1, 16 and 64, through
our frontend with kv routing and with
round-robin, each on a fresh mocker at full speed (``--speedup 1``). Per point: TTFT p50, output
tokens/s and the frontend's CPU per output token; and the ratios kv / round-robin. On one H200 the same
engine under round-robin was even with SGLang's own gateway, while kv routing (the per-request prompt
hashing and the engines' KV events) cost TTFT at c16 and c64: the ratios here guard that path without a
GPU. Figures, never assertions; on a shared 2-core machine read the ratios, not the absolute figures.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

from dynamo_worker.bench.client import OpenAITarget, Target
from dynamo_worker.bench.stats import Report

from tests.bench.fleet import MODEL, Fleet

PROFILE = "builtin:sglang-1b-h200"
ENGINE_FLAGS = ("--profile", PROFILE, "--chunked-prefill-size", "8192", "--context-length", "8192")
CONCURRENCY = (1, 16, 64)
WORDS, OUT = "fixed:750", "fixed:256"  # 750 words: about 2048 tokens


def _requests(conc: int, scale: float) -> int:
    return max(4, int(conc * 3 * scale))


def run(workdir: Path, scale: float, measure: Callable[..., Report], workload: Callable) -> dict:
    """``measure`` and ``workload`` are the scenarios' (``tests.bench.scenarios``)."""
    print(
        f"\n== 9. small engine: 1 mocker with {PROFILE} at speedup 1, {WORDS} words in / {OUT} tokens out, "
        f"closed loop at concurrency {', '.join(map(str, CONCURRENCY))}, kv routing vs round-robin ==",
        flush=True,
    )
    out: dict = {}
    with Fleet(workdir / "small-engine") as fleet:
        for side in ("kv", "round-robin"):
            ns = f"bench-small-{uuid.uuid4().hex[:6]}"
            mocker = fleet.mocker(ns, "null", *ENGINE_FLAGS, speedup=1.0)
            fe = fleet.frontend(ns, side)
            fleet.wait_workers(fe, {"agg": 1})
            port = fe.ports["http"]
            for conc in CONCURRENCY:
                n = _requests(conc, scale)
                cpu = fe.cpu_s()

                def target(session, port=port) -> Target:
                    return OpenAITarget(session, f"http://127.0.0.1:{port}", MODEL, timeout_s=120)

                report = measure(
                    target, workload(conc, WORDS, OUT), concurrency=conc, num_requests=n, duration_s=120
                )
                cpu_us = 1e6 * (fe.cpu_s() - cpu) / max(1, report.output_tokens)
                out[f"{side}/c{conc}"] = report
                out[f"{side}/c{conc}/frontend_cpu_us_per_token"] = cpu_us
                ttft = report.ttft_ms.p50 if report.ttft_ms else float("nan")
                print(
                    f"  {side:11} c{conc:<3} TTFT p50 {ttft:7.1f} ms  {report.output_tokens_per_s:7.0f} "
                    f"tok/s  frontend CPU {cpu_us:5.1f} us/token  errors {sum(report.errors.values())}",
                    flush=True,
                )
                for error, message in report.error_examples.items():
                    print(f"  {side} c{conc} error {error}: {message}", flush=True)
            fleet.retire([mocker, fe])
    print("small engine, kv / round-robin:", flush=True)
    for conc in CONCURRENCY:
        kv, rr = out[f"kv/c{conc}"], out[f"round-robin/c{conc}"]
        ttft = (
            f"{kv.ttft_ms.p50 / rr.ttft_ms.p50:.2f}" if kv.ttft_ms and rr.ttft_ms and rr.ttft_ms.p50 else "-"
        )
        tps = f"{kv.output_tokens_per_s / rr.output_tokens_per_s:.2f}" if rr.output_tokens_per_s else "-"
        print(f"  c{conc:<3} TTFT p50 {ttft}x  tokens/s {tps}x", flush=True)
    return out
