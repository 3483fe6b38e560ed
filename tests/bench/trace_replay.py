"""Replay a Mooncake request trace through our frontend + mocker and NVIDIA Dynamo 1.6.1's (``make
bench-trace``): not a test, it prints figures.

``python -m tests.bench.trace_replay [--dynamo-venv DIR] [--trace FILE] ...`` takes a window of the trace
(``--start-s``, ``--duration-s``, ``--count``), sends it ``--speedup`` times as fast as recorded, open
loop (each request leaves at its scaled time, whether or not earlier ones have finished), streaming
completions, and prints per stack: TTFT p50/p90, ITL p50/p90 (per request: the mean gap after the first
token, as aiperf counts it), goodput at TTFT <= 2 s and ITL <= 25 ms (the SLO Dynamo publishes its
trace replays with: requests/s and the share of requests within both), the cached share of prompt
tokens (the servers' ``usage.prompt_tokens_details.cached_tokens``) beside the most any router could
find (``max``: prompt blocks an earlier request of the window sent), output tokens/s, how late the
client sent its latest request (a busy machine's lag), and the CPU time per request of the frontend
(its process group) and of the engines over the replay.

Prompts are built from the hash ids (``tests.bench.trace``): each id a block of 512 words of the
word-level model (``tests.bench.wordmodel``, one word one token), the same for every stack. Each stack
is a frontend with KV routing in front of ``--workers`` simulated engines on 127.0.0.1, started fresh
(empty caches), one stack after the other: ours (``dynamo_worker.mocker``, ``--router-mode kv``) and,
with ``--dynamo-venv``, Dynamo's (``dynamo.mocker --engine-type sglang``, file discovery, TCP request
plane, ``--router-mode kv`` with its KV events). Both engines get the same page size, KV blocks,
running-request cap and chunked prefill, and the same timing: ``--profile`` (default
``builtin:sglang-1b-h200``; Dynamo's mocker gets it as its perf-data NPZ, ``dynamo_perf_npz``);
``--profile none`` leaves each mocker its own default timing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from dynamo_worker.bench.client import OpenAITarget, Target, make_session
from dynamo_worker.bench.stats import RequestResult, percentile
from dynamo_worker.bench.workload import RequestSpec
from dynamo_worker.profile.model import load_profile
from dynamo_worker.runtime.nats_server import free_port

from tests.bench import trace
from tests.bench.fleet import Fleet, Proc
from tests.bench.peers import _wait_serving
from tests.bench.wordmodel import ensure_word_model, vocabulary

__all__ = ["Options", "Summary", "main", "replay", "requests_of", "run_stack", "summarize"]

REPO = Path(__file__).resolve().parents[2]
TRACE = Path("/work/shared/traces/mooncake-conversation.jsonl")
CACHE = Path.home() / ".cache" / "dynamo-sglang" / "bench"
MODEL = "word"
CONTEXT = 131_072  # the trace's longest prompts are ~125k tokens
# Dynamo's frontend reports no cached tokens in usage; asked, its stream's timing carries the router's
# overlap with the chosen worker's cache (``kv_hit_rate``), which the client counts as cached instead.
DYNAMO_NVEXT = {"nvext": {"extra_fields": ["timing"]}}


@dataclass(frozen=True)
class Options:
    """What a replay runs: the window, its pace and the engines' shape (the CLI's flags)."""

    trace: Path = TRACE
    start_s: float = 0.0
    duration_s: float | None = None
    count: int | None = 300
    speedup: float = 4.0
    workers: int = 4
    profile: str | None = "builtin:sglang-1b-h200"
    engine_speedup: float = 1.0
    page_size: int = 16
    kv_blocks: int = 16384
    max_running: int = 256
    chunked_prefill: int = 8192
    drain_s: float = 120.0
    frontend_args: tuple[str, ...] = ()  # ours: extra frontend flags, e.g. ("--router-mode", "round-robin")


# --- requests and figures ------------------------------------------------------------------------------


def requests_of(window: Sequence[trace.TraceRequest]) -> list[RequestSpec]:
    """One completions request per trace request: its hash ids' blocks of words (ids 3.. of the word
    model: whole words, one token each), ``max_tokens`` its output length."""
    words = vocabulary()
    blocks = trace.BlockTokens(3, len(words))
    out = []
    for i, r in enumerate(window):
        text = " ".join(words[t] for t in trace.prompt_ids(r, blocks))
        out.append(RequestSpec(i, ({"role": "user", "content": text},), r.output_length, r.input_length))
    return out


async def replay(
    target: Target, specs: Sequence[RequestSpec], send_at_s: Sequence[float], drain_s: float
) -> tuple[list[RequestResult], float]:
    """Send each request at its time (seconds from now), open loop; the results in the requests' order
    and how late, at most, a request left (seconds). Requests still running ``drain_s`` after the last
    send are cancelled and reported as ``cancelled``."""
    t0 = time.perf_counter()
    tasks: list[asyncio.Task[RequestResult]] = []
    lag = 0.0
    for spec, at in zip(specs, send_at_s, strict=True):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        lag = max(lag, time.perf_counter() - t0 - at)
        tasks.append(asyncio.create_task(target.send(spec)))
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=drain_s)
        for task in pending:
            task.cancel()
    results = []
    for task in tasks:
        try:
            results.append(task.result())
        except asyncio.CancelledError:
            now = time.perf_counter()
            results.append(RequestResult(start=now, end=now, error="cancelled", error_message="drain ended"))
    return results, lag


@dataclass(frozen=True)
class Summary:
    requests: int
    completed: int
    errors: dict[str, int]
    duration_s: float
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    itl_p50_ms: float | None
    itl_p90_ms: float | None
    goodput_rps: float
    good_share: float
    cached_share: float | None
    cacheable_share: float
    output_tokens_per_s: float
    send_lag_ms: float
    frontend_cpu_ms_per_request: float | None = None  # the frontend's process group, over the replay
    worker_cpu_ms_per_request: float | None = None  # the simulated engines' processes, over the replay


def _pct(values: list[float], q: float) -> float | None:
    return 1e3 * percentile(values, q) if values else None


def summarize(
    results: Sequence[RequestResult],
    window: Sequence[trace.TraceRequest],
    send_lag_s: float = 0.0,
    cpu_s: tuple[float, float] | None = None,
) -> Summary:
    """The figures of one replay of ``window`` (``results`` in its order); ``cpu_s``: the frontend's
    and the engines' CPU seconds over it."""
    ok = [r for r in results if r.ok and r.first_chunk is not None]
    ttft = [r.first_chunk - r.start for r in ok if r.first_chunk is not None]
    itl = [trace.request_itl_s(r.first_chunk, r.end, r.output_tokens) for r in ok if r.first_chunk]
    good = trace.goodput(zip(ttft, itl, strict=True))
    duration = max(r.end for r in results) - min(r.start for r in results) if results else 0.0
    prompt = sum(r.prompt_tokens or 0 for r in ok if r.cached_tokens is not None)
    cached = sum(r.cached_tokens or 0 for r in ok)
    errors: dict[str, int] = {}
    for r in results:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    itl_known = [x for x in itl if x is not None]
    return Summary(
        requests=len(results),
        completed=len(ok),
        errors=dict(sorted(errors.items())),
        duration_s=duration,
        ttft_p50_ms=_pct(ttft, 50),
        ttft_p90_ms=_pct(ttft, 90),
        itl_p50_ms=_pct(itl_known, 50),
        itl_p90_ms=_pct(itl_known, 90),
        goodput_rps=good / duration if duration > 0 else 0.0,
        good_share=good / len(results) if results else 0.0,
        cached_share=cached / prompt if prompt else None,
        cacheable_share=trace.cacheable_share(window),
        output_tokens_per_s=sum(r.output_tokens for r in ok) / duration if duration > 0 else 0.0,
        send_lag_ms=1e3 * send_lag_s,
        frontend_cpu_ms_per_request=1e3 * cpu_s[0] / len(results) if cpu_s and results else None,
        worker_cpu_ms_per_request=1e3 * cpu_s[1] / len(results) if cpu_s and results else None,
    )


# --- stacks --------------------------------------------------------------------------------------------


def ensure_trace_model(folder: Path) -> Path:
    """The word model at ``folder`` with a context of ``CONTEXT`` tokens (the trace's prompts are
    longer than the word model's 8192)."""
    ensure_word_model(folder)
    for name, key in (
        ("config.json", "max_position_embeddings"),
        ("tokenizer_config.json", "model_max_length"),
    ):
        data = json.loads((folder / name).read_text())
        if data[key] != CONTEXT:
            data[key] = CONTEXT
            (folder / name).write_text(json.dumps(data, indent=1) + "\n")
    return folder


def dynamo_perf_npz(profile: str, python: str, path: Path) -> Path:
    """Our profile as Dynamo's mocker perf data (``--planner-profile-data`` of a mocker-format NPZ:
    TTFT by input length, ITL on a grid of active KV tokens x context length, batch = kv / context),
    written with the Dynamo venv's numpy."""
    p = load_profile(profile)
    isl = [float(x) for x in range(128, CONTEXT + 1, 1024)]
    kv = [float(x) for x in range(0, 2_000_001, 20_000)]
    ctx = [float(x) for x in range(1, CONTEXT + 1, 1024)]
    grid = {
        "prefill_isl": isl,
        "prefill_ttft_ms": [1e3 * p.ttft_s(n) for n in isl],
        "decode_active_kv_tokens": kv,
        "decode_context_length": ctx,
        "decode_itl": [[1e3 * p.itl_s(max(1.0, k / c), c) for c in ctx] for k in kv],
    }
    source = path.with_suffix(".json")
    source.write_text(json.dumps(grid))
    code = "import json,sys,numpy as np; np.savez(sys.argv[2], **json.load(open(sys.argv[1])))"
    subprocess.run([python, "-c", code, str(source), str(path)], check=True)
    return path


def _ours(fleet: Fleet, o: Options) -> Proc:
    ns = f"trace-{uuid.uuid4().hex[:6]}"
    flags = ["--page-size", str(o.page_size), "--num-kv-blocks", str(o.kv_blocks)]
    flags += ["--max-running-requests", str(o.max_running), "--chunked-prefill-size", str(o.chunked_prefill)]
    flags += ["--context-length", str(CONTEXT), *(["--profile", o.profile] if o.profile else [])]
    for _ in range(o.workers):
        fleet.mocker(ns, "null", *flags, speedup=o.engine_speedup)
    frontend = fleet.frontend(ns, "kv", *o.frontend_args)
    fleet.wait_workers(frontend, {"agg": o.workers}, timeout=120)
    return frontend


def _short_port() -> int:
    """A free port below 32768."""
    for _ in range(100):
        port = random.randrange(20000, 32768)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below 32768")


def _dynamo(fleet: Fleet, o: Options, venv: Path) -> Proc:
    python = str(venv / "bin" / "python")
    env = {"DYN_FILE_KV": str(fleet.workdir / f"dynamo-{uuid.uuid4().hex[:6]}"), "DYN_LOG": "warn"}
    common = ["--discovery-backend", "file", "--request-plane", "tcp"]
    flags = ["--engine-type", "sglang", "--block-size", str(o.page_size)]
    flags += ["--num-gpu-blocks-override", str(o.kv_blocks), "--max-num-seqs", str(o.max_running)]
    flags += [
        "--sglang-chunked-prefill-size",
        str(o.chunked_prefill),
        "--speedup-ratio",
        str(o.engine_speedup),
    ]
    if o.profile:
        npz = dynamo_perf_npz(o.profile, python, fleet.workdir / "dynamo-perf.npz")
        flags += ["--planner-profile-data", str(npz)]
    for i in range(o.workers):
        args = ["dynamo.mocker", "--model-path", str(fleet.model_dir), "--model-name", MODEL, *flags, *common]
        system = _short_port()  # its /metrics (Dynamo reads the port as an i16)
        fleet.spawn(f"dynamo-mocker-{i}", args, {"system": system}, python=python,
                    env={**env, "DYN_SYSTEM_PORT": str(system), "DYN_SYSTEM_ENABLED": "true"})  # fmt: skip
    ports = {"http": free_port()}
    args = ["dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(ports["http"]), *common]
    frontend = fleet.spawn("dynamo-frontend", [*args, "--router-mode", "kv"], ports, python=python, env=env)
    _wait_serving(fleet, frontend)
    return frontend


def run_stack(
    name: str, workdir: Path, o: Options, venv: Path | None = None, model_dir: Path | None = None
) -> Summary:
    """A fresh stack (ours, or Dynamo's from ``venv``), the window replayed through it, the stack
    stopped; its processes log under ``workdir/name``, the model is written to ``model_dir``."""
    window = trace.scale(trace.window(trace.load(o.trace), start_s=o.start_s, duration_s=o.duration_s,
                                      count=o.count), o.speedup)  # fmt: skip
    specs = requests_of(window)
    model_dir = ensure_trace_model(model_dir or CACHE / "word-model-long")
    with Fleet(workdir / name, model_dir, MODEL) as fleet:
        frontend = _ours(fleet, o) if venv is None else _dynamo(fleet, o, venv)
        url = f"http://127.0.0.1:{frontend.ports['http']}"

        async def go() -> tuple[list[RequestResult], float]:
            async with make_session() as session:
                target = OpenAITarget(session, url, MODEL, api="completions", timeout_s=o.drain_s,
                                      extra_body=DYNAMO_NVEXT if venv else None)  # fmt: skip
                at = [r.timestamp_ms / 1e3 for r in window]
                return await replay(target, specs, at, o.drain_s)

        workers = [p for p in fleet.procs if "mocker" in p.name]
        cpu = lambda: (frontend.cpu_s(), sum(w.cpu_s() for w in workers))  # noqa: E731
        before = cpu()
        results, lag = asyncio.run(go())
        after = cpu()
    return summarize(results, window, lag, (after[0] - before[0], after[1] - before[1]))


# --- report --------------------------------------------------------------------------------------------

ROWS = (
    ("TTFT p50 ms", "ttft_p50_ms"), ("TTFT p90 ms", "ttft_p90_ms"), ("ITL p50 ms", "itl_p50_ms"),
    ("ITL p90 ms", "itl_p90_ms"), ("goodput req/s", "goodput_rps"), ("within SLO (share)", "good_share"),
    ("cached share", "cached_share"), ("cacheable share (max)", "cacheable_share"),
    ("output tokens/s", "output_tokens_per_s"), ("completed", "completed"),
    ("client send lag ms", "send_lag_ms"), ("frontend CPU ms/request", "frontend_cpu_ms_per_request"),
    ("engines' CPU ms/request", "worker_cpu_ms_per_request"),
)  # fmt: skip


def table(summaries: dict[str, Summary]) -> str:
    cell = lambda v: "-" if v is None else f"{v:.1f}" if abs(v) >= 10 else f"{v:.3f}"  # noqa: E731
    names = list(summaries)
    lines = [f"{'figure':<24}" + "".join(f"{n:>14}" for n in names)]
    for label, attr in ROWS:
        lines.append(f"{label:<24}" + "".join(f"{cell(getattr(summaries[n], attr)):>14}" for n in names))
    for n, s in summaries.items():
        if s.errors:
            lines.append(f"{n} errors: {s.errors}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    d = Options()
    p = argparse.ArgumentParser(
        prog="python -m tests.bench.trace_replay",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--trace", type=Path, default=d.trace, help="Mooncake-format trace (jsonl)")
    p.add_argument("--start-s", type=float, default=d.start_s, help="window start, seconds of trace time")
    p.add_argument("--duration-s", type=float, default=None, help="window length, seconds of trace time")
    p.add_argument("--count", type=int, default=d.count, help="at most this many requests (0: no cap)")
    p.add_argument("--speedup", type=float, default=d.speedup, help="send N times as fast as recorded")
    p.add_argument("--workers", type=int, default=d.workers, help="simulated engines per stack")
    p.add_argument("--profile", default=d.profile, help="the engines' timing profile ('none': defaults)")
    p.add_argument("--engine-speedup", type=float, default=d.engine_speedup, help="divides engine time")
    p.add_argument("--kv-blocks", type=int, default=d.kv_blocks, help="KV blocks per engine (16 tokens)")
    p.add_argument("--dynamo-venv", type=Path, help="venv with ai-dynamo 1.6.1 (without: ours only)")
    p.add_argument("--rounds", type=int, default=1, help="replays per stack, alternating (median)")
    p.add_argument("--json-out", type=Path, help="write every summary here")
    p.add_argument("--workdir", type=Path, help="process logs (default: a temporary folder)")
    return p


def _median(runs: list[Summary]) -> Summary:
    if len(runs) == 1:
        return runs[0]
    fields: dict = {}
    for k, v in asdict(runs[0]).items():
        values = [getattr(r, k) for r in runs]
        numeric = all(isinstance(x, int | float) for x in values)
        fields[k] = statistics.median(values) if numeric else v
    return Summary(**fields)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.trace.is_file():
        parser.error(f"no trace at {args.trace}: pass --trace (Mooncake's FAST25-release/traces/*.jsonl)")
    o = Options(
        trace=args.trace, start_s=args.start_s, duration_s=args.duration_s, count=args.count or None,
        speedup=args.speedup, workers=args.workers,
        profile=None if args.profile == "none" else args.profile, engine_speedup=args.engine_speedup,
        kv_blocks=args.kv_blocks,
    )  # fmt: skip
    stacks: dict[str, Path | None] = {"ours": None}
    if args.dynamo_venv is not None:
        stacks = {"Dynamo 1.6.1": args.dynamo_venv, "ours": None}
    print(
        f"== trace replay: {o.trace.name}, from {o.start_s:g}s, {o.count or 'all'} requests, speedup "
        f"{o.speedup:g}; {o.workers} engines per stack ({o.profile or 'default timing'}, engine speedup "
        f"{o.engine_speedup:g}); {', '.join(stacks)}; {args.rounds} round(s) ==",
        flush=True,
    )
    runs: dict[str, list[Summary]] = {n: [] for n in stacks}
    with tempfile.TemporaryDirectory(prefix="dynamo-trace-") as tmp:
        workdir = args.workdir or Path(tmp)
        for round_ in range(args.rounds):
            order = list(stacks.items()) if round_ % 2 == 0 else list(stacks.items())[::-1]
            for name, venv in order:
                s = run_stack("dynamo" if venv else "ours", workdir / f"r{round_}", o, venv)
                runs[name].append(s)
                print(f"  {name} round {round_ + 1}: {json.dumps(asdict(s))}", flush=True)
    summaries = {n: _median(r) for n, r in runs.items()}
    print("\n" + table(summaries), flush=True)
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({n: [asdict(s) for s in r] for n, r in runs.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
