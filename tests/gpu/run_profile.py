"""Profile our SGLang worker on one GPU, then check that the mocker loaded with that profile predicts
its TTFT and ITL (issue 17).

usage: python tests/gpu/run_profile.py        (see tests/gpu/README.md for the device call)

1. An embedded nats-server, our frontend and one aggregated SGLang worker on GPU 0 (the 8B shape with
   dummy weights and ``run_gpu.py``'s flags, ``--mem-fraction-static 0.80``, ``--max-total-tokens``
   ``PROF_MAX_TOTAL_TOKENS``, ``--chunked-prefill-size`` ``PROF_CHUNK``, ``--context-length 16384``).
2. ``dynamo_worker.profile``'s sweep on the worker's request plane (so the frontend's own cost is not
   in the profile; the mocker adds nothing of it either): prefill TTFT over ``PROF_ISL`` (lone
   requests, median of 3) and decode ITL over ``PROF_BATCH`` x ``PROF_CONTEXT``; the profile is written
   to ``$OUT/sglang-8b-h100.json`` (``source: measured``): the file shipped in
   ``worker/dynamo_worker/profile/data/`` is this output.
3. Three operating points (``POINTS``: input length, output length, concurrency) measured through the
   frontend on the GPU worker: TTFT p50 and ITL p50 (per request, (last - first token) / (n - 1)).
4. The GPU worker is stopped and a mocker started in its place with ``--profile`` of the measured file
   and the same KV capacity (``--num-kv-blocks`` = max total tokens / page size); the same three points.
5. The table: GPU vs mocker per point and metric, the ratio, and whether it is within ``PROF_TOLERANCE``
   (0.15). Printed last and in ``$OUT/profile.txt``, raw figures in ``$OUT/profile.json``; exit 1 when
   a point is outside the tolerance or anything failed.

``ENGINE=mocker`` runs every step with a mocker in place of SGLang (loaded with the shipped profile),
so the suite exercises the script without a GPU (``tests/integration/sglang/test_gpu_profile_script.py``).

Env: ENGINE, PROF_ISL, PROF_BATCH, PROF_CONTEXT, PROF_DECODE_OSL, PROF_MAX_TOTAL_TOKENS, PROF_CHUNK,
PROF_TOLERANCE, PROF_NREQ_SCALE, PROF_POINTS (``isl:osl:conc,...``), STARTUP_S, GRAPHS.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("MEM_FRACTION", "0.80")  # one engine on the GPU: the usual share
os.environ.setdefault("MAX_TOTAL_TOKENS", "")  # set below, the same for the engine and the mocker
# The 8B shape's config says 8192 positions; the sweep's longest prompt plus its output needs more, and
# dummy weights have no quality to lose.
os.environ.setdefault("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import run_gpu
from run_gpu import (
    ENGINE,
    MODEL,
    MODEL_DIR,
    OUT,
    STARTUP_S,
    Stack,
    free_port,
    log,
    make_model,
    ours_stream,
    prompts,
    run_load,
    wait_http,
    wait_served,
)


def _ints(name: str, default: str) -> list[int]:
    return [int(v) for v in os.environ.get(name, default).split(",") if v]


ISL = _ints("PROF_ISL", "128,512,1024,2048,4096,8192")
BATCH = _ints("PROF_BATCH", "1,8,32,64")
CONTEXT = _ints("PROF_CONTEXT", "256,1024,2048,4096")
DECODE_OSL = int(os.environ.get("PROF_DECODE_OSL", 128))  # tokens each decode cell times per request
# Room for the largest decode cell (64 x (4096 + 64) tokens) so no request of a batch waits.
MAX_TOTAL_TOKENS = int(os.environ.get("PROF_MAX_TOTAL_TOKENS", 300000))
CHUNK = int(os.environ.get("PROF_CHUNK", 8192))  # SGLang's chunked prefill size on an 80 GB GPU
PAGE = 16
TOLERANCE = float(os.environ.get("PROF_TOLERANCE", 0.15))
NREQ_SCALE = float(os.environ.get("PROF_NREQ_SCALE", 2))  # requests per point = scale x concurrency (>= 8)
POINTS = [
    tuple(int(v) for v in p.split(":"))
    for p in os.environ.get("PROF_POINTS", "2048:64:1,1024:128:16,4096:128:32").split(",")
    if p
]
REQUEST_PORT = free_port()  # the sweep talks to the worker's request plane: no frontend in the profile
PROFILE_FILE = OUT / "sglang-8b-h100.json"
SHIPPED = Path(__file__).resolve().parents[2] / "worker/dynamo_worker/profile/data/sglang-8b-h100.json"
# The prefill token budget per scheduler step is explicit, so the mocker is given the same one.
ENGINE_FLAGS = ["--max-total-tokens", str(MAX_TOTAL_TOKENS), "--context-length", "16384",
                "--chunked-prefill-size", str(CHUNK)]  # fmt: skip
MOCKER_FLAGS = ["--num-kv-blocks", str(MAX_TOTAL_TOKENS // PAGE)]


def gpu_name() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout.strip().splitlines()[0].replace(" ", "-") or "unknown"
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown"


def sglang_version() -> str:
    try:
        from importlib.metadata import version

        return f"sglang {version('sglang')}"
    except Exception:
        return "sglang"


def start_engine(stack: Stack, profile: Path | None):
    """Our aggregated worker on GPU 0: SGLang, or the mocker loaded with ``profile``."""
    extra = [*ENGINE_FLAGS]
    if profile is not None:
        extra += ["--profile", str(profile), *MOCKER_FLAGS]
    proc, system_port = stack.start_worker("agg", 0, *extra, request_port=REQUEST_PORT)
    took = wait_http(proc, f"http://127.0.0.1:{system_port}/health", STARTUP_S)
    log(f"{proc.name} ready in {took:.0f}s")
    return proc


async def measure_points(base: str, label: str) -> list[dict]:
    import aiohttp

    rows = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        for n, (isl, osl, conc) in enumerate(POINTS):
            nreq = max(8, int(NREQ_SCALE * conc))
            reqs = prompts(nreq, isl, seed=500 + n)
            warm = prompts(2, isl, seed=900 + n)
            row = await run_load(f"{label} {isl}/{osl} c={conc}", ours_stream(session, base, osl), reqs, osl,
                                 conc, warm)  # fmt: skip
            rows.append({"isl": isl, "osl": osl, "conc": conc, "ttft_p50_ms": row.ttft_p50,
                         "itl_p50_ms": row.itl_p50, "errors": row.errors})  # fmt: skip
    return rows


async def sweep() -> None:
    import aiohttp
    from dynamo_worker.profile.model import Profile
    from dynamo_worker.profile.sweep import Sweeper

    async with aiohttp.ClientSession() as session:
        s = Sweeper(session, f"127.0.0.1:{REQUEST_PORT}", MODEL, "worker", vocab=(100, 30000))
        try:
            prefill = await s.prefill(ISL, 3)
            log(f"prefill TTFT ms over ISL {ISL}: {prefill.ttft_ms}")
            decode = await s.decode(BATCH, CONTEXT, DECODE_OSL)
            for b, row in zip(BATCH, decode.itl_ms, strict=True):
                log(f"decode ITL ms at batch {b} over context {CONTEXT}: {row}")
        finally:
            await s.close()
    engine = sglang_version() if ENGINE == "sglang" else "mocker (shipped profile)"
    profile = Profile(
        model="Llama-3.1-8B shape (tests/gpu/model/config.json: 32 layers, 8 KV heads, bf16)",
        engine=f"{engine}, triton attention, decode CUDA graphs" if ENGINE == "sglang" else engine,
        gpu=gpu_name() if ENGINE == "sglang" else "none",
        gpus_per_replica=1,
        source="measured" if ENGINE == "sglang" else "mocker",
        note=(
            "measured by tests/gpu/run_profile.py on our SGLang worker's request plane (dummy weights, "
            f"page size {PAGE}, --max-total-tokens {MAX_TOTAL_TOKENS}, --chunked-prefill-size {CHUNK}: give "
            "the mocker the same); prefill: lone requests, median of 3; "
            "decode: b requests at once, mean context c"
        ),
        prefill=prefill,
        decode=decode,
    )
    PROFILE_FILE.write_text(profile.model_dump_json(indent=2) + "\n")
    log(f"wrote {PROFILE_FILE}")


async def run() -> dict:
    stack = Stack()
    result: dict = {"engine": ENGINE, "points": POINTS}
    try:
        stack.start_nats()
        engine = start_engine(stack, SHIPPED if ENGINE == "mocker" else None)
        stack.start_frontend()
        base = f"http://127.0.0.1:{stack.http_port}/v1"
        await wait_served(base, {"agg"})
        await sweep()
        result["gpu"] = await measure_points(base, "engine")
        engine.stop(grace_s=30)
        stack.procs.remove(engine)
        run_gpu.ENGINE = "mocker"  # the same command line, the mocker's module, its profile
        start_engine(stack, PROFILE_FILE)
        await wait_served(base, {"agg"})
        result["mocker"] = await measure_points(base, "mocker")
    finally:
        stack.close()
    return result


def table(result: dict) -> tuple[str, bool]:
    lines = [
        f"== mocker (--profile measured) vs {ENGINE} engine, through our frontend; tolerance "
        f"{TOLERANCE:.0%} ==",
        f"{'point (isl/osl, conc)':24} {'metric':9} {'engine ms':>10} {'mocker ms':>10} {'ratio':>7}  ok",
    ]
    ok = bool(result.get("gpu")) and bool(result.get("mocker"))
    for g, m in zip(result.get("gpu", []), result.get("mocker", []), strict=False):
        point = f"{g['isl']}/{g['osl']}, c={g['conc']}"
        for metric, key in (("TTFT p50", "ttft_p50_ms"), ("ITL p50", "itl_p50_ms")):
            ratio = m[key] / g[key] if g[key] else float("nan")
            within = abs(ratio - 1) <= TOLERANCE and not g["errors"] and not m["errors"]
            ok &= within
            verdict = "yes" if within else "NO"
            lines.append(f"{point:24} {metric:9} {g[key]:10.2f} {m[key]:10.2f} {ratio:6.2f}x  {verdict}")
    if result.get("error"):
        lines.append(f"error: {result['error']}")
    lines += ["", f"profile: {PROFILE_FILE}", f"RESULT: {'PASS' if ok else 'FAIL'}"]
    return "\n".join(lines), ok


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    OUT.mkdir(parents=True, exist_ok=True)
    if not (MODEL_DIR / "tokenizer.json").is_file():
        make_model(MODEL_DIR)
    try:
        result = asyncio.run(run())
    except Exception as e:  # the run ends with its reason and a failing table
        log(f"FAILED: {e!r}")
        result = {"error": repr(e)}
    (OUT / "profile.json").write_text(json.dumps(result, indent=1))
    text, ok = table(result)
    (OUT / "profile.txt").write_text(text)
    print(text, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
