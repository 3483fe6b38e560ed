"""Benchmark scenarios (not tests): ``python -m tests.bench.scenarios`` (``make bench``).

Each comparison runs both sides in this one invocation, on this machine, and prints their ratio. The
mocker stands in for the GPU engine (timing model divided by ``--speedup``), so absolute figures are the
machine's; ratios are what carries over. Load comes from ``dynamo_worker.bench`` (the project's one load
generator); processes from ``tests.bench.fleet`` (on ports they bind on 127.0.0.1, all stopped at the end).

1. frontend: closed loop at fixed concurrency, through the frontend (OpenAI completions, SSE,
   tokenize/detokenize, routing) vs straight to the same mocker's request plane (the prompt tokenized
   by the same tokenizer; different words per side, so neither finds the other's prompts cached), and
   the frontend's own CPU time (its process group) per request and per output token.
2. router: kv with its defaults vs round-robin, each on a fresh fleet of 4 mockers x 160 KV blocks of
   64 tokens, on three workloads: "prefix64" (64 shared prefixes, cache pressure), "few-prefix" (4
   prefixes, no pressure) and a Mooncake-style multi-turn conversation trace: cached share of prompt
   tokens, TTFT p50/p90, req/s and their ratios.
3. disagg: 1 prefill + 1 decode mocker vs 2 aggregated mockers, same workload and timing model.
4. operator: K = 1, 10, 100 DGDs applied to the local control plane (``tests/bench/bench_operator.py``,
   owned by the operator work): time to children created and to Ready, the operator's CPU and RSS.
5. request-plane: round trip and streaming tokens/s between two processes
   (``tests/bench/bench_request_plane.py``, owned by the runtime work).
6. planner: one traffic pattern served by a fixed 1P:1D graph, a fixed pair of aggregated workers, and
   a graph the SLA planner scales within a GPU budget: GPU-seconds and SLO attainment of each
   (``tests/bench/bench_planner.py``).
7. kv-tiers: tier-aware kv routing (default weights) vs GPU-only (``--kv-host-hit-weight 0``), each on a
   fresh fleet of 4 mockers with a small GPU cache and a HiCache host tier, on a longmultiturn-like
   trace (interleaved conversations whose KV is 3.4 times the fleet's GPU caches): TTFT p50/p90 and the
   cached share of prompt tokens, split into found on the GPU and loaded from host memory.
8. gateway: a real Envoy and the endpoint picker (``--router-mode kv``) in front of a frontend in
   ``--router-mode direct`` vs that frontend alone in ``--router-mode kv``, each on a fresh fleet of 2
   mockers at the engine's pace (speedup 1), closed loop at concurrency 32 on a shared-prefix workload:
   the p50 latency the Envoy + picker hop adds (TTFT, E2E) and the cached share of both.

9. small-engine: one mocker with the 1B shape's H200 profile, chat requests at c1, c16 and c64 through
   our frontend, kv routing vs round-robin: TTFT p50, tokens/s, frontend CPU per token and the ratios
   (``tests/bench/small_engine.py``).

Side by side with NVIDIA Dynamo's frontend: ``python -m tests.bench.peers`` (``make bench-peers``).

Caps keep the whole run within 10 minutes on a 2-core machine (``--scale`` scales request counts).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
from dynamo_worker.bench.client import OpenAITarget, RequestPlaneTarget, Target, make_session
from dynamo_worker.bench.runner import IteratorWorkload, Workload, run_load
from dynamo_worker.bench.stats import Report, format_comparison, summarize
from dynamo_worker.bench.workload import (
    LengthDist,
    RequestSpec,
    conversation_trace,
    prefix_pool_requests,
    random_requests,
)

from tests.bench.fleet import MODEL, Fleet, Proc
from tests.support.envoy import envoy_command, envoy_config
from tests.support.ports import free_ports
from tests.support.procs import popen as start_process

OPERATOR_BOUND_S = 450  # the operator benchmark (cluster start + K = 1, 10, 100) must end by then
SCENARIOS = (
    "frontend", "router", "disagg", "operator", "request-plane", "planner", "kv-tiers", "gateway",
    "small-engine",
)  # fmt: skip
REPO = Path(__file__).resolve().parents[2]


def _namespace(tag: str) -> str:
    return f"bench-{tag}-{uuid.uuid4().hex[:6]}"


def _random(seed: int, words: str, out: str) -> Callable[[], Workload]:
    return lambda: IteratorWorkload(
        random_requests(random.Random(seed), LengthDist.parse(words), LengthDist.parse(out))
    )


def measure(
    make_target: Callable[..., Target],
    make_workload: Callable[[], Workload],
    *,
    concurrency: int,
    num_requests: int,
    duration_s: float,
    warmup: int = 0,
) -> Report:
    """Warm up, then one closed-loop run; its report."""

    async def go() -> Report:
        async with make_session() as session:
            target = make_target(session)
            try:
                return await run(target)
            finally:
                await target.close()

    async def run(target: Target) -> Report:
        if warmup:
            await run_load(
                target,
                _random(999, "fixed:16", "fixed:4")(),
                concurrency=concurrency,
                num_requests=warmup,
                duration_s=30,
                drain_s=10,
            )
        results = await run_load(
            target,
            make_workload(),
            concurrency=concurrency,
            num_requests=num_requests,
            duration_s=duration_s,
            drain_s=15,
        )
        return summarize(results)

    return asyncio.run(go())


def _openai(fe_port: int, api: str = "completions") -> Callable[..., Target]:
    return lambda session: OpenAITarget(session, f"http://127.0.0.1:{fe_port}", MODEL, api=api, timeout_s=60)


def scenario_frontend(workdir: Path, scale: float) -> dict[str, Report]:
    """The frontend's cost: same workload, same mocker, with and without the frontend in the path."""
    concurrency, n = 16, int(1000 * scale)
    print(
        f"\n== 1. frontend overhead: closed loop, concurrency {concurrency}, {n} requests of 128 words in, "
        "64 tokens out, 1 mocker at speedup 100 ==",
        flush=True,
    )
    with Fleet(workdir / "frontend") as fleet:
        ns = _namespace("fe")
        mocker = fleet.mocker(ns, speedup=100)
        fe = fleet.frontend(ns)
        fleet.wait_workers(fe, {"agg": 1})
        # Different prompts per side, so neither finds the other's prompts in the mocker's prefix cache.
        tokenizer = fleet.model_dir / "tokenizer.json"
        direct = measure(
            lambda _session: RequestPlaneTarget(
                f"127.0.0.1:{mocker.ports['request']}", MODEL, tokenizer, timeout_s=60
            ),
            _random(1, "fixed:128", "fixed:64"),
            concurrency=concurrency,
            num_requests=n,
            duration_s=60,
            warmup=20,
        )
        cpu_before = fe.cpu_s()  # includes the warm-up: a few requests more than counted
        through = measure(
            _openai(fe.ports["http"]),
            _random(2, "fixed:128", "fixed:64"),
            concurrency=concurrency,
            num_requests=n,
            duration_s=60,
            warmup=20,
        )
        cpu_s = fe.cpu_s() - cpu_before
    print(format_comparison("frontend", through, "direct", direct), flush=True)
    print(_added(through, direct), flush=True)
    cpu = {
        "cpu_us_per_request": 1e6 * cpu_s / max(1, through.completed),
        "cpu_us_per_token": 1e6 * cpu_s / max(1, through.output_tokens),
    }
    print(
        f"  frontend CPU time (process): {cpu['cpu_us_per_request']:.0f} us per request, "
        f"{cpu['cpu_us_per_token']:.1f} us per output token",
        flush=True,
    )
    return {"frontend": through, "direct": direct, "frontend_cpu": cpu}


def _added(through: Report, direct: Report) -> str:
    """What the frontend adds, in milliseconds: per request (TTFT, E2E) and per token (TPOT), p50."""
    parts = []
    for name, attr in (("TTFT", "ttft_ms"), ("E2E", "e2e_ms"), ("TPOT", "tpot_ms")):
        a, b = getattr(through, attr), getattr(direct, attr)
        if a is not None and b is not None:
            parts.append(f"{name} p50 {a.p50 - b.p50:+.2f} ms")
    return "  added by the frontend: " + ", ".join(parts)


ROUTER_WORKERS, ROUTER_PAGE, ROUTER_BLOCKS = 4, 64, 160  # the "prefix64" fleet of issue 20
ROUTER_CONCURRENCY, ROUTER_OUT = 8, 16
ROUTER_SPEEDUP = 0.5  # slower than the default timing, so the simulated work outweighs CPU noise


def _router_workloads(scale: float) -> dict[str, tuple[str, Callable[[], list[RequestSpec]]]]:
    n = max(64, int(640 * scale))
    return {
        "prefix64": (
            f"{n} requests, each one of 64 shared prefixes of 448 tokens (7 blocks) + 8 unique tokens "
            "(cache pressure: all prefixes fit in the fleet, not in one worker; ideal cached share ~0.88)",
            lambda: prefix_pool_requests(
                random.Random(64), num_prefixes=64, prefix_tokens=448, suffix_tokens=8,
                num_requests=n, max_tokens=ROUTER_OUT,
            ),
        ),
        "few-prefix": (
            f"{n} requests, each one of 4 shared prefixes of 448 tokens + 8 unique tokens (no cache "
            "pressure: every worker can hold them all)",
            lambda: prefix_pool_requests(
                random.Random(4), num_prefixes=4, prefix_tokens=448, suffix_tokens=8,
                num_requests=n, max_tokens=ROUTER_OUT,
            ),
        ),
        "multi-turn": (
            f"Mooncake-style trace: {max(16, int(64 * scale))} conversations x 4 turns on 4 system prompts "
            "of 512 tokens; each turn adds 64 tokens standing in for the answer and 96 of user message",
            lambda: conversation_trace(
                random.Random(7), conversations=max(16, int(64 * scale)), turns=4, system_prompts=4,
                system_tokens=512, user_tokens=96, answer_tokens=64, max_tokens=ROUTER_OUT,
            ),
        ),
    }  # fmt: skip


def _ratio_line(name: str, kv: Report, rr: Report) -> str:
    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a is not None and b else "-"

    def ms(d, q: str) -> float | None:
        return getattr(d, q) if d is not None else None

    p50 = ratio(ms(kv.ttft_ms, "p50"), ms(rr.ttft_ms, "p50"))
    p90 = ratio(ms(kv.ttft_ms, "p90"), ms(rr.ttft_ms, "p90"))
    return (
        f"  {name}: cached share kv {kv.cache_hit_rate or 0:.3f} vs rr {rr.cache_hit_rate or 0:.3f} "
        f"({ratio(kv.cache_hit_rate, rr.cache_hit_rate)}); TTFT p50 {p50}, p90 {p90}; "
        f"req/s {ratio(kv.requests_per_s, rr.requests_per_s)}"
    )


def scenario_router(workdir: Path, scale: float) -> dict[str, Report]:
    """kv (defaults) vs round-robin on three shared-prefix workloads; each side gets its own fresh
    fleet of mockers (empty caches), started on one nats-server. ``BENCH_KV_ARGS`` (e.g.
    "--kv-overlap-weight 2") adds flags to the kv frontend, to compare settings;
    ``BENCH_ROUTER_WORKLOADS`` (e.g. "prefix64,few-prefix") runs only those workloads."""
    print(
        f"\n== 2. router quality: kv (defaults) vs round-robin, {ROUTER_WORKERS} mockers x "
        f"{ROUTER_BLOCKS} KV blocks of {ROUTER_PAGE} tokens, closed loop at concurrency "
        f"{ROUTER_CONCURRENCY}, {ROUTER_OUT} output tokens, mocker speedup {ROUTER_SPEEDUP:g}, completions "
        "API with token-id prompts ==",
        flush=True,
    )
    reports: dict[str, Report] = {}
    summary: list[str] = []
    with Fleet(workdir / "router") as fleet:
        chosen = os.environ.get("BENCH_ROUTER_WORKLOADS", "")
        for name, (describe, make) in _router_workloads(scale).items():
            if chosen and name not in chosen.split(","):
                continue
            print(f"\n-- {name}: {describe}", flush=True)
            specs = make()
            for side in ("kv", "round-robin"):
                ns = _namespace(f"rt-{name}")
                workers = [
                    fleet.mocker(
                        ns, "null", "--page-size", str(ROUTER_PAGE), "--num-kv-blocks", str(ROUTER_BLOCKS),
                        speedup=ROUTER_SPEEDUP,
                    )
                    for _ in range(ROUTER_WORKERS)
                ]  # fmt: skip
                extra = os.environ.get("BENCH_KV_ARGS", "").split() if side == "kv" else []
                fe = fleet.frontend(ns, side, *extra)
                fleet.wait_workers(fe, {"agg": ROUTER_WORKERS})
                reports[f"{name}/{side}"] = measure(
                    _openai(fe.ports["http"]),
                    lambda specs=specs: IteratorWorkload(iter(specs)),
                    concurrency=ROUTER_CONCURRENCY,
                    num_requests=len(specs),
                    duration_s=180,
                )
                fleet.retire([*workers, fe])
            kv, rr = reports[f"{name}/kv"], reports[f"{name}/round-robin"]
            print(format_comparison("kv", kv, "round-robin", rr), flush=True)
            for side, report in (("kv", kv), ("round-robin", rr)):
                for error, message in report.error_examples.items():
                    print(f"  {side} error {error}: {message}", flush=True)
            summary.append(_ratio_line(name, kv, rr))
    print("\nrouter summary (kv defaults / round-robin):\n" + "\n".join(summary), flush=True)
    return reports


def scenario_disagg(workdir: Path, scale: float) -> dict[str, Report]:
    """Disaggregated (1 prefill + 1 decode) vs aggregated (2 workers) with the mocker's timing model."""
    concurrency, n = 16, int(160 * scale)
    print(
        f"\n== 3. disaggregated vs aggregated: 2 mockers each side at speedup 5, closed loop, concurrency "
        f"{concurrency}, {n} requests of 1024 words in, 64 tokens out ==",
        flush=True,
    )
    workload = _random(3, "fixed:1024", "fixed:64")
    with Fleet(workdir / "disagg") as fleet:
        agg_ns, dis_ns = _namespace("agg"), _namespace("dis")
        fleet.mocker(agg_ns, speedup=5)
        fleet.mocker(agg_ns, speedup=5)
        fleet.mocker(dis_ns, "prefill", speedup=5)
        fleet.mocker(dis_ns, "decode", speedup=5)
        agg_fe = fleet.frontend(agg_ns)
        dis_fe = fleet.frontend(dis_ns)
        fleet.wait_workers(agg_fe, {"agg": 2})
        fleet.wait_workers(dis_fe, {"prefill": 1, "decode": 1})
        dis = measure(
            _openai(dis_fe.ports["http"]),
            workload,
            concurrency=concurrency,
            num_requests=n,
            duration_s=60,
            warmup=8,
        )
        agg = measure(
            _openai(agg_fe.ports["http"]),
            workload,
            concurrency=concurrency,
            num_requests=n,
            duration_s=60,
            warmup=8,
        )
    print(format_comparison("disagg", dis, "agg", agg), flush=True)
    return {"disagg": dis, "agg": agg}


TIERS_WORKERS, TIERS_PAGE, TIERS_BLOCKS, TIERS_HOST_RATIO = 4, 16, 256, 16
TIERS_CONCURRENCY, TIERS_OUT, TIERS_SPEEDUP = 8, 16, 1.0


def _host_cached_tokens(fe_port: int) -> float:
    """The frontend's ``dynamo_frontend_cached_tokens_host`` so far (all models)."""
    import re
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{fe_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.findall(r"^dynamo_frontend_cached_tokens_host_total(?:{[^}]*})? (\S+)$", text, re.M)
    return sum(float(v) for v in found)


def scenario_kv_tiers(workdir: Path, scale: float) -> dict:
    """Tier-aware vs GPU-only kv routing on mockers with a HiCache host tier: a trace of interleaved
    conversations (each comes back after every other one spoke, its KV long evicted from the GPU into
    host memory). Both sides run the same trace on their own fresh fleet."""
    conversations = max(16, int(32 * scale))
    system, user, answer, turns = 256, 384, 64, 4
    own = turns * user + (turns - 1) * answer
    fleet_tokens = TIERS_WORKERS * TIERS_BLOCKS * TIERS_PAGE
    print(
        f"\n== 7. KV tiers: tier-aware (--kv-host-hit-weight 0.75) vs GPU-only (0) kv routing, "
        f"{TIERS_WORKERS} mockers x {TIERS_BLOCKS} KV blocks of {TIERS_PAGE} tokens + HiCache host "
        f"memory {TIERS_HOST_RATIO}x that, closed loop at concurrency {TIERS_CONCURRENCY}, {TIERS_OUT} "
        f"output tokens; {conversations} conversations x {turns} turns (a shared {system}-token system "
        f"prompt, {user} tokens of user text a turn, {answer} of answer resent), interleaved: their KV is "
        f"{(conversations * own + system) / fleet_tokens:.1f}x the fleet's GPU caches ==",
        flush=True,
    )
    specs = conversation_trace(
        random.Random(35), conversations=conversations, turns=turns, system_prompts=1, system_tokens=system,
        user_tokens=user, answer_tokens=answer, max_tokens=TIERS_OUT,
    )  # fmt: skip
    prompt_tokens = sum(len(s.prompt_ids or ()) for s in specs)
    reports: dict = {}
    lines = []
    with Fleet(workdir / "kv-tiers") as fleet:
        for side, extra in (
            ("tier-aware", []),
            ("gpu-only", ["--kv-host-hit-weight", "0", "--kv-disk-hit-weight", "0"]),
        ):
            ns = _namespace(f"tiers-{side}")
            workers = [
                fleet.mocker(
                    ns, "null", "--page-size", str(TIERS_PAGE), "--num-kv-blocks", str(TIERS_BLOCKS),
                    "--enable-hierarchical-cache", "--hicache-ratio", str(TIERS_HOST_RATIO),
                    speedup=TIERS_SPEEDUP,
                )
                for _ in range(TIERS_WORKERS)
            ]  # fmt: skip
            fe = fleet.frontend(ns, "kv", *extra)
            fleet.wait_workers(fe, {"agg": TIERS_WORKERS})
            report = measure(
                _openai(fe.ports["http"]),
                lambda: IteratorWorkload(iter(specs)),
                concurrency=TIERS_CONCURRENCY,
                num_requests=len(specs),
                duration_s=300,
            )
            host = _host_cached_tokens(fe.ports["http"]) / prompt_tokens
            cached = report.cache_hit_rate or 0.0
            reports[side] = {
                "report": report.to_dict(),
                "cached_share_host": host,
                "cached_share_gpu": cached - host,
            }
            p50 = report.ttft_ms.p50 if report.ttft_ms is not None else float("nan")
            p90 = report.ttft_ms.p90 if report.ttft_ms is not None else float("nan")
            lines.append(
                f"  {side:10}: TTFT p50 {p50:7.1f} ms, p90 {p90:7.1f} ms; cached share {cached:.3f} "
                f"(GPU {cached - host:.3f}, host memory {host:.3f}); errors {sum(report.errors.values())}"
            )
            fleet.retire([*workers, fe])
    print("\nKV tiers summary:\n" + "\n".join(lines), flush=True)
    return reports


def _run_bounded(cmd: list[str], bound_s: float) -> int | None:
    """Run another benchmark script; its exit code, or None when it overran ``bound_s``. On overrun (or
    Ctrl-C / an error here) it gets SIGINT, not SIGTERM, so its cleanup runs and stops what it started."""
    proc = subprocess.Popen(cmd, cwd=REPO)
    try:
        return proc.wait(bound_s)
    except subprocess.TimeoutExpired:
        print(f"{cmd[2]} still running after {bound_s:.0f}s: interrupting it", flush=True)
        return None
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def scenario_request_plane(workdir: Path, scale: float) -> dict:
    """Request-plane round trip and streaming tokens/s between two processes, measured by the runtime
    work's own benchmark (``tests.bench.bench_request_plane``)."""
    print("\n== 5. request plane: round trip and streaming between two local processes ==", flush=True)
    returncode = _run_bounded([sys.executable, "-m", "tests.bench.bench_request_plane"], 60)
    return {"exit_code": returncode}


def scenario_operator(workdir: Path, scale: float) -> dict:
    """K DGDs against the local control plane, measured by the operator work's own benchmark
    (``tests.bench.bench_operator``: it starts the control plane, an operator per K, and prints its
    table with the time ratios between K)."""
    ks = ["1", "10", "100"]
    print(f"\n== 4. operator scale: K = {', '.join(ks)} DGDs on the local control plane ==", flush=True)
    out = workdir / "operator.json"
    cmd = [
        sys.executable,
        "-m",
        "tests.bench.bench_operator",
        "--k",
        *ks,
        "--timeout",
        "240",
        "--json-out",
        str(out),
    ]
    returncode = _run_bounded(cmd, OPERATOR_BOUND_S)
    if returncode is None:
        return {"failed": f"timeout after {OPERATOR_BOUND_S}s"}
    if returncode != 0:
        print(f"operator benchmark failed with exit code {returncode}", flush=True)
        return {"failed": f"exit code {returncode}"}
    return {"results": orjson.loads(out.read_bytes()) if out.exists() else []}


LEGEND = (
    "Figures: TTFT = send -> first output chunk; ITL = gaps between output chunks as the client reads them "
    "(chunks that arrive in one read show ~0 ms: TPOT is the per-token figure); TPOT = (E2E - TTFT) / "
    "(tokens - 1); ratio = left column / right column, both sides run in this invocation."
)


GATEWAY_CONCURRENCY = 32
# The mockers at the engine's own pace, as in serving: the hop's latency is what is measured. Faster
# mockers make the closed loop a measure of how many requests a second one picker process decides.
GATEWAY_SPEEDUP = 1.0


def _gateway(fleet: Fleet, ns: str, frontend: Proc) -> tuple[Proc, Proc]:
    """The endpoint picker (kv) naming ``frontend``, and Envoy in front of it (the docs' configuration);
    Envoy's port is its process's ``http``."""
    epp = fleet.spawn(
        f"{ns}-epp",
        [
            "dynamo_worker.epp", "--host", "127.0.0.1", "--grpc-port", "0", "--metrics-port", "0",
            "--namespace", ns, "--nats-server", fleet.nats.url,
            "--frontends", f"127.0.0.1:{frontend.ports['http']}",
        ],
        {},
        listeners={"grpc": "grpc", "metrics": "metrics"},
    )  # fmt: skip
    fleet.wait_healthy(epp, f"http://127.0.0.1:{epp.ports['metrics']}/health")
    (port,) = free_ports(1)
    config = fleet.workdir / f"{ns}-envoy.yaml"
    config.write_text(envoy_config(port, epp.ports["grpc"]))
    log_path = fleet.workdir / f"{ns}-envoy.log"
    with open(log_path, "wb") as out:
        popen = start_process(envoy_command(config), stdout=out, stderr=subprocess.STDOUT)
    envoy = Proc(f"{ns}-envoy", popen, log_path, {"http": port})
    fleet.procs.append(envoy)
    fleet.wait_healthy(envoy, f"http://127.0.0.1:{port}/health")  # the frontend's, through Envoy
    return epp, envoy


def _decision_ms(epp: Proc) -> float | None:
    """The picker's mean time per decision (``dynamo_epp_decision_seconds``: body in -> answer out)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{epp.ports['metrics']}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = re.search(r"^dynamo_epp_decision_seconds_sum (\S+)$", text, re.M)
    count = re.search(r"^dynamo_epp_decision_seconds_count (\S+)$", text, re.M)
    if not (total and count and float(count[1])):
        return None
    return 1000 * float(total[1]) / float(count[1])


def scenario_gateway(workdir: Path, scale: float) -> dict[str, Report]:
    """Envoy + the endpoint picker + a direct frontend vs the frontend alone (kv), fresh mockers each."""
    n = max(64, int(640 * scale))
    print(
        f"\n== 8. gateway: Envoy + endpoint picker (kv) + frontend (direct) vs frontend alone (kv), 2 "
        f"mockers each side at speedup {GATEWAY_SPEEDUP:g}, closed loop, concurrency {GATEWAY_CONCURRENCY}, "
        f"{n} requests of one of 16 shared prefixes of 256 tokens + 8 unique, 16 tokens out ==",
        flush=True,
    )
    # both sides get the same requests: the comparison is of the hop, not of two workloads
    specs = prefix_pool_requests(
        random.Random(81), num_prefixes=16, prefix_tokens=256, suffix_tokens=8, num_requests=n,
        max_tokens=16,
    )  # fmt: skip
    reports: dict[str, Report] = {}
    decision_ms: float | None = None
    with Fleet(workdir / "gateway") as fleet:
        for side in ("alone", "gateway"):
            ns = _namespace(f"gw-{side}")
            workers = [fleet.mocker(ns, speedup=GATEWAY_SPEEDUP) for _ in range(2)]
            fe = fleet.frontend(ns, "kv" if side == "alone" else "direct")
            fleet.wait_workers(fe, {"agg": 2})
            epp, entry = _gateway(fleet, ns, fe) if side == "gateway" else (None, fe)
            reports[side] = measure(
                _openai(entry.ports["http"]),
                lambda: IteratorWorkload(iter(specs)),
                concurrency=GATEWAY_CONCURRENCY,
                num_requests=n,
                duration_s=120,
                warmup=20,
            )
            if epp is not None:
                decision_ms = _decision_ms(epp)
            fleet.retire([p for p in fleet.procs if p.name.startswith(ns)] + workers)
    gateway, alone = reports["gateway"], reports["alone"]
    print(format_comparison("gateway", gateway, "alone", alone), flush=True)
    print(_added(gateway, alone).replace("the frontend", "Envoy + the picker"), flush=True)
    print(
        f"  cached share: gateway {gateway.cache_hit_rate or 0:.3f}, "
        f"frontend alone {alone.cache_hit_rate or 0:.3f}",
        flush=True,
    )
    if decision_ms is not None:
        print(f"  the picker's own time per decision (mean, warm-up included): {decision_ms:.2f} ms")
    return {**reports, "gateway_decision_ms": {"mean": decision_ms}}


def scenario_planner(workdir: Path, scale: float) -> dict:
    from tests.bench import bench_planner

    return bench_planner.run(workdir / "planner")


def scenario_small_engine(workdir: Path, scale: float) -> dict:
    from tests.bench import small_engine

    return small_engine.run(workdir, scale, measure, lambda seed, words, out: _random(seed, words, out))


RUNNERS = {
    "frontend": scenario_frontend,
    "router": scenario_router,
    "disagg": scenario_disagg,
    "kv-tiers": scenario_kv_tiers,
    "operator": scenario_operator,
    "request-plane": scenario_request_plane,
    "planner": scenario_planner,
    "gateway": scenario_gateway,
    "small-engine": scenario_small_engine,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.scenarios",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--only",
        default=",".join(SCENARIOS),
        help=f"comma-separated scenarios to run, of {', '.join(SCENARIOS)} (default: all)",
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiplies request counts (0.25 for a quick look); caps still apply",
    )
    parser.add_argument("--json-out", type=Path, default=None, help="write every report as JSON here")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="folder for process logs (default: a temporary folder, removed at the end)",
    )
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in RUNNERS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}: choose from {', '.join(SCENARIOS)}")
    started = time.monotonic()
    print(LEGEND, flush=True)
    reports: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="dynamo-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        for name in chosen:
            t = time.monotonic()
            try:
                result = RUNNERS[name](workdir, args.scale)
            except KeyboardInterrupt:
                print(f"\ninterrupted during {name}; every process started was stopped", flush=True)
                return 130
            reports[name] = {k: (v.to_dict() if isinstance(v, Report) else v) for k, v in result.items()}
            print(f"({name}: {time.monotonic() - t:.0f}s)", flush=True)
    print(f"\nall scenarios: {time.monotonic() - started:.0f}s", flush=True)
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_bytes(orjson.dumps(reports, option=orjson.OPT_INDENT_2))
        print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
