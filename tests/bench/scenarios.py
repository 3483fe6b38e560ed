"""Benchmark scenarios (not tests): ``python -m tests.bench.scenarios`` (``make bench``).

Each comparison runs both sides in this one invocation, on this machine, and prints their ratio. The
mocker stands in for the GPU engine (timing model divided by ``--speedup``), so absolute figures are the
machine's; ratios are what carries over. Load comes from ``dynamo_worker.bench`` (the project's one load
generator); processes from ``tests.bench.fleet`` (free ports on 127.0.0.1, all stopped at the end).

1. frontend: closed loop at fixed concurrency, through the frontend (OpenAI completions, SSE,
   tokenize/detokenize, routing) vs straight to the same mocker's request plane (the prompt tokenized
   by the same tokenizer; different words per side, so neither finds the other's prompts cached).
2. router: kv (default overlap weight, and a tuned one) vs round-robin frontends on one fleet of
   mocker workers whose KV cache holds about a third of the system prompts, on the shared-prefix
   multi-turn workload (different system prompts per side): cache hit rate and TTFT.
3. disagg: 1 prefill + 1 decode mocker vs 2 aggregated mockers, same workload and timing model.
4. operator: K = 1, 10, 100 DGDs applied to the local control plane (``tests/bench/bench_operator.py``,
   owned by the operator work): time to children created and to Ready, the operator's CPU and RSS.
5. request-plane: round trip and streaming tokens/s between two processes
   (``tests/bench/bench_request_plane.py``, owned by the runtime work).
6. planner: one traffic pattern served by a fixed 1P:1D graph, a fixed pair of aggregated workers, and
   a graph the SLA planner scales within a GPU budget: GPU-seconds and SLO attainment of each
   (``tests/bench/bench_planner.py``).

Caps keep the whole run within 10 minutes on a 2-core machine (``--scale`` scales request counts).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
from dynamo_worker.bench.client import OpenAITarget, RequestPlaneTarget, Target, make_session
from dynamo_worker.bench.runner import IteratorWorkload, SharedPrefixWorkload, Workload, run_load
from dynamo_worker.bench.stats import Report, format_comparison, summarize
from dynamo_worker.bench.workload import LengthDist, random_requests, shared_prefix_turns

from tests.bench.fleet import MODEL, Fleet

ROUTER_SPEEDUP = 2.0  # slow enough that prefill of uncached tokens shows in TTFT
# Per worker: room for about a third of the system prompts (~95 blocks each) plus the running batch, so
# a router that sends every prefix everywhere (round-robin) evicts what a prefix-aware one keeps.
ROUTER_KV_BLOCKS = 768
TUNED_WEIGHT = 4.0  # kv router: overlap weight that favours cache hits over load spreading
OPERATOR_BOUND_S = 450  # the operator benchmark (cluster start + K = 1, 10, 100) must end by then
SCENARIOS = ("frontend", "router", "disagg", "operator", "request-plane", "planner")
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
            lambda s: RequestPlaneTarget(
                s, f"127.0.0.1:{mocker.ports['request']}", MODEL, tokenizer, timeout_s=60
            ),
            _random(1, "fixed:128", "fixed:64"),
            concurrency=concurrency,
            num_requests=n,
            duration_s=60,
            warmup=20,
        )
        through = measure(
            _openai(fe.ports["http"]),
            _random(2, "fixed:128", "fixed:64"),
            concurrency=concurrency,
            num_requests=n,
            duration_s=60,
            warmup=20,
        )
    print(format_comparison("frontend", through, "direct", direct), flush=True)
    print(_added(through, direct), flush=True)
    return {"frontend": through, "direct": direct}


def _added(through: Report, direct: Report) -> str:
    """What the frontend adds, in milliseconds: per request (TTFT, E2E) and per token (TPOT), p50."""
    parts = []
    for name, attr in (("TTFT", "ttft_ms"), ("E2E", "e2e_ms"), ("TPOT", "tpot_ms")):
        a, b = getattr(through, attr), getattr(direct, attr)
        if a is not None and b is not None:
            parts.append(f"{name} p50 {a.p50 - b.p50:+.2f} ms")
    return "  added by the frontend: " + ", ".join(parts)


def scenario_router(workdir: Path, scale: float) -> dict[str, Report]:
    """kv (default overlap weight, and a tuned one) vs round-robin on one fleet: 3 mockers, one frontend
    per router mode, each side with its own system prompts."""
    prefixes, users, turns = 12, max(2, int(4 * scale)), 3
    print(
        f"\n== 2. router quality: shared prefix ({prefixes} system prompts of 512 words x {users} users x "
        f"{turns} turns), 3 mockers of {ROUTER_KV_BLOCKS} KV blocks at speedup {ROUTER_SPEEDUP:g}, "
        "concurrency 8 ==",
        flush=True,
    )

    def plan(seed: int) -> Callable[[], Workload]:
        return lambda: SharedPrefixWorkload(
            shared_prefix_turns(
                random.Random(seed),
                num_prefixes=prefixes,
                users_per_prefix=users,
                turns=turns,
                prefix_words=512,
                input_len=LengthDist.parse("uniform:32,96"),
                output_len=LengthDist.parse("fixed:32"),
            ),
            seed,
        )

    with Fleet(workdir / "router") as fleet:
        ns = _namespace("rt")
        for _ in range(3):
            fleet.mocker(ns, "null", "--num-kv-blocks", str(ROUTER_KV_BLOCKS), speedup=ROUTER_SPEEDUP)
        sides = {
            "kv": fleet.frontend(ns, "kv"),
            f"kv w={TUNED_WEIGHT:g}": fleet.frontend(ns, "kv", "--kv-overlap-weight", str(TUNED_WEIGHT)),
            "round-robin": fleet.frontend(ns, "round-robin"),
        }
        for fe in sides.values():
            fleet.wait_workers(fe, {"agg": 3})
        total = prefixes * users * turns
        reports = {
            name: measure(
                _openai(fe.ports["http"], "chat"), plan(11 * (i + 1)), concurrency=8, num_requests=total,
                duration_s=90, warmup=8,
            )
            for i, (name, fe) in enumerate(sides.items())
        }  # fmt: skip
    for name in list(sides)[:2]:
        print(format_comparison(name, reports[name], "round-robin", reports["round-robin"]), flush=True)
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


def scenario_planner(workdir: Path, scale: float) -> dict:
    from tests.bench import bench_planner

    return bench_planner.run(workdir / "planner")


RUNNERS = {
    "frontend": scenario_frontend,
    "router": scenario_router,
    "disagg": scenario_disagg,
    "operator": scenario_operator,
    "request-plane": scenario_request_plane,
    "planner": scenario_planner,
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
