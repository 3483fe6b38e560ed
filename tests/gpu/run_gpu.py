"""GPU proof: our frontend + SGLang worker, aggregated and disaggregated, against SGLang's own server.

usage: python tests/gpu/run_gpu.py agg|disagg|all     (see tests/gpu/README.md for the device calls)

Phase ``agg``: an embedded nats-server, our frontend, our SGLang worker (``python -m
dynamo_worker.sglang``, aggregated) on GPU 0 and SGLang's own server (``sglang.launch_server``) on GPU 1,
same flags, same dummy weights (``--load-format dummy --random-seed 1``). Checks, with the official
``openai`` client: greedy completions through our stack equal SGLang's for the same token ids;
streaming gives the same tokens as non-streaming; usage counts are right. Then benchmarks the same
batch and a concurrency sweep through our frontend and against SGLang's native ``/generate``.

Phase ``disagg``: one prefill worker on GPU 0 and one decode worker on GPU 1 (NIXL), the prefill one
with no ``--disaggregation-bootstrap-port`` (the worker picks and publishes one). Checks greedy outputs
equal phase ``agg``'s, streaming and usage, benchmarks the batch, then kills the prefill worker while
requests are in their prefill leg: every request must end (an error or its completion) within
``KILL_BOUND_S``, none may hang. Prints the summary of both phases last.

Results of ``agg`` wait in ``$GPU_STATE`` (default /tmp/dynamo-gpu-state) for ``disagg``; everything
printed and every log lands in ``$OUT``. ``ENGINE=mocker`` runs the same script on the simulated
engine (no GPU, no SGLang: the native comparisons are skipped) to validate it before using GPU time.

Env: ENGINE (sglang|mocker), GRAPHS (1: SGLang captures decode CUDA graphs; 0: none), ISL, OSL, NREQ,
SWEEP (concurrencies, e.g. "1,4,16,64"), KILL_BOUND_S, STARTUP_S, PROBES.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dynamo_worker.runtime.children import die_with_parent

HERE = Path(__file__).resolve().parent
OUT = Path(os.environ.get("OUT") or "/tmp/dynamo-gpu-out")
STATE = Path(os.environ.get("GPU_STATE") or "/tmp/dynamo-gpu-state")
ENGINE = os.environ.get("ENGINE", "sglang")
GRAPHS = os.environ.get("GRAPHS", "1") == "1"
ISL, OSL, NREQ = (int(os.environ.get(k, d)) for k, d in (("ISL", 2048), ("OSL", 64), ("NREQ", 32)))
SWEEP = [int(c) for c in os.environ.get("SWEEP", "1,4,16,64").split(",") if c]
KILL_BOUND_S = float(os.environ.get("KILL_BOUND_S", 30))
STARTUP_S = float(os.environ.get("STARTUP_S", 420))
PROBES, PROBE_LEN, PROBE_OUT = int(os.environ.get("PROBES", 4)), 300, 24
# GPUS=1: every engine shares GPU 0 (one-GPU machines), each with a small memory share and the same
# KV capacity, so ours and native still compare like for like.
GPUS = int(os.environ.get("GPUS", 2))
MEM_FRACTION = os.environ.get("MEM_FRACTION", "0.80" if GPUS > 1 else "0.40")
MAX_TOTAL_TOKENS = os.environ.get("MAX_TOTAL_TOKENS", "" if GPUS > 1 else "80000")
# SGLang takes --mem-fraction-static of the memory free when it loads, so on one GPU the engines start
# one after the other and the second takes this share of what the first left.
SECOND_MEM_FRACTION = os.environ.get("SECOND_MEM_FRACTION", "0.65")
MODEL = "llama8b-dummy"
MODEL_DIR = Path(os.environ.get("MODEL_DIR") or "/tmp/dynamo-gpu-model")
NAMESPACE = "gpu-proof"
TOKEN = re.compile(r"w(\d+)")
DIE_WITH_PARENT = die_with_parent(signal.SIGKILL)

SGLANG_FLAGS = [
    "--load-format", "dummy", "--random-seed", "1", "--page-size", "16",
    "--mem-fraction-static", MEM_FRACTION,
    "--attention-backend", "triton", "--sampling-backend", "pytorch", "--grammar-backend", "none",
    "--cuda-graph-backend-prefill", "disabled", "--mm-feature-transport", "cpu", "--skip-server-warmup",
    "--context-length", "8192",
]  # fmt: skip
if not GRAPHS:
    SGLANG_FLAGS += ["--cuda-graph-backend-decode", "disabled"]
if MAX_TOTAL_TOKENS:
    SGLANG_FLAGS += ["--max-total-tokens", MAX_TOTAL_TOKENS]


def gpu(index: int) -> int:
    """The GPU of the index-th engine: its own on a multi-GPU machine, GPU 0 when GPUS=1."""
    return index if GPUS > 1 else 0


def second_engine_flags() -> list[str]:
    """Flags of an engine that shares GPU 0 with one already loaded (GPUS=1)."""
    return [] if GPUS > 1 else ["--mem-fraction-static", SECOND_MEM_FRACTION]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the model folder: the 8B-shaped config plus a tokenizer whose token i is "w<i>" ----------------


def make_model(folder: Path, config: dict | None = None) -> Path:
    """SGLang reads only config.json (dummy weights); our frontend needs a tokenizer for the model card.
    A word-level tokenizer with one token ``w<i>`` per id maps any id to text and back exactly.
    ``config``: another config.json than ``tests/gpu/model``'s (``run_lora``'s model of real weights)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    config = config or json.loads((HERE / "model" / "config.json").read_text())
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    vocab = {f"w{i}": i for i in range(config["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    bos, eos = config["bos_token_id"], config["eos_token_id"]
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": f"w{bos}",
                "eos_token": f"w{eos}",
                "add_bos_token": False,
                "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
            }
        )
    )
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eos}))
    return folder


def ids_of(text: str) -> list[int]:
    return [int(m) for m in TOKEN.findall(text)]


# --- processes --------------------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    cmd: list[str]
    popen: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return OUT / "logs" / f"{self.name}.log"

    def start(self) -> Proc:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"$ {' '.join(self.cmd)}\n".encode())
            out.flush()
            # its own process group (killed whole), and SIGKILLed by the kernel if this script dies
            self.popen = subprocess.Popen(
                [*DIE_WITH_PARENT, *self.cmd], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        log(f"started {self.name} pid={self.popen.pid}")
        return self

    def tail(self, n: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group (SGLang's scheduler processes included), at once."""
        if self.popen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(10)

    def stop(self, grace_s: float = 60) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                log(f"{self.name} did not stop within {grace_s}s; killing it")
        self.kill()


def wait_http(proc: Proc, url: str, limit_s: float = STARTUP_S) -> float:
    """Seconds until ``url`` answers 200; fails early (with the log tail) when ``proc`` exits."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited rc={proc.popen.returncode}:\n{proc.tail()}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=3) as r:
            if r.status == 200:
                return time.monotonic() - start
        time.sleep(1)
    raise RuntimeError(f"{proc.name} not ready at {url} within {limit_s:.0f}s:\n{proc.tail()}")


class Stack:
    """NATS + frontend + workers (+ SGLang's own server), all stopped by ``close``."""

    def __init__(self) -> None:
        self.procs: list[Proc] = []
        self.nats_port = free_port()
        self.http_port = free_port()

    def start_nats(self) -> None:
        binary = shutil.which("nats-server") or str(Path(sys.executable).parent / "nats-server")
        store = STATE / f"nats-{self.nats_port}"
        self.nats = self._add(
            "nats", [binary, "-a", "127.0.0.1", "-p", str(self.nats_port), "-js", "-sd", str(store)]
        )
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.nats_port), 1):
                return
            if time.monotonic() > deadline or not self.nats.alive():
                raise RuntimeError(f"nats-server did not start:\n{self.nats.tail()}")
            time.sleep(0.2)

    def start_frontend(self) -> Proc:
        cmd = [sys.executable, "-m", "dynamo_worker.frontend", "--http-host", "127.0.0.1",
               "--http-port", str(self.http_port), "--namespace", NAMESPACE,
               "--nats-server", f"nats://127.0.0.1:{self.nats_port}"]  # fmt: skip
        return self._add("frontend", cmd)

    def start_worker(self, role: str, gpu: int, *extra: str, request_port: int = 0) -> tuple[Proc, int]:
        system_port = free_port()
        module = "dynamo_worker.sglang" if ENGINE == "sglang" else "dynamo_worker.mocker"
        mode = {"agg": "null"}.get(role, role)
        cmd = [sys.executable, "-m", module, "--model-path", str(MODEL_DIR), "--served-model-name", MODEL,
               "--disaggregation-mode", mode, "--base-gpu-id", str(gpu), "--port", str(free_port()),
               *SGLANG_FLAGS, *extra,
               "--namespace", NAMESPACE, "--component", role, "--nats-server", f"nats://127.0.0.1:{self.nats_port}",
               "--system-port", str(system_port), "--request-port", str(request_port),
               "--listen-host", "127.0.0.1",
               "--advertise-host", "127.0.0.1", "--graceful-shutdown-s", "5"]  # fmt: skip
        if role != "agg":
            cmd += ["--disaggregation-transfer-backend", "nixl"]
        if ENGINE == "mocker":
            cmd += ["--vocab-size", "128256", "--eos-probability", "0"]
        else:  # the canary behind /health runs during the whole proof
            cmd += ["--canary-interval-s", "5"]
        return self._add(role, cmd), system_port

    def start_native(self, gpu: int, *extra: str) -> tuple[Proc, int]:
        port = free_port()
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(MODEL_DIR),
               "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(port), "--base-gpu-id", str(gpu),
               *SGLANG_FLAGS, *extra]  # fmt: skip
        return self._add("sglang-native", cmd), port

    def _add(self, name: str, cmd: list[str]) -> Proc:
        proc = Proc(name, cmd).start()
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop(grace_s=5 if proc.name == "frontend" else 60)
        self.procs.clear()


async def wait_served(base: str, roles: set[str], limit_s: float = 120) -> None:
    """Until the frontend lists the model and answers a one-token request (all roles registered)."""
    import openai

    deadline = time.monotonic() + limit_s
    async with openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0, timeout=60) as client:
        while True:
            try:
                models = await client.models.list()
                if any(m.id == MODEL for m in models.data):
                    await client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=1)
                    return
            except openai.APIError as e:
                last = e
            else:
                last = "model not listed yet"
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"frontend does not serve {MODEL} with roles {roles} in {limit_s}s: {last}"
                )
            await asyncio.sleep(1)


# --- requests -------------------------------------------------------------------------------------


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 30000) for _ in range(length)] for _ in range(n)]


async def ours_once(client, ids: list[int], n: int) -> dict:
    """One greedy completion through our frontend, non-streaming and streaming."""
    extra = {"ignore_eos": True}
    full = await client.completions.create(
        model=MODEL, prompt=ids, max_tokens=n, temperature=0, extra_body=extra
    )
    stream = await client.completions.create(
        model=MODEL, prompt=ids, max_tokens=n, temperature=0, extra_body=extra, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    text, chunks, usage = "", 0, None
    async for event in stream:
        piece = "".join(c.text or "" for c in event.choices)
        chunks += bool(piece)
        text += piece
        usage = event.usage or usage
    return {
        "ids": ids_of(full.choices[0].text),
        "stream_ids": ids_of(text),
        "stream_chunks": chunks,
        "usage": full.usage.model_dump() if full.usage else None,
        "stream_usage": usage.model_dump() if usage else None,
        "finish_reason": full.choices[0].finish_reason,
    }


async def native_once(session, port: int, ids: list[int], n: int) -> list[int]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
    async with session.post(f"http://127.0.0.1:{port}/generate", json=body) as r:
        text = await r.text()
        if r.status != 200:
            raise RuntimeError(f"SGLang /generate answered {r.status}: {text[:300]}")
        return json.loads(text)["output_ids"][:n]


def correctness(results: list[dict], n: int) -> dict:
    """Streaming equals non-streaming, and usage is right (prompt = ids sent, completion = n)."""
    stream_ok = sum(
        r["ids"] == r["stream_ids"] and len(r["ids"]) == n and r["stream_chunks"] > 1 for r in results
    )
    usage_ok = sum(
        r["usage"] is not None
        and r["stream_usage"] is not None
        and r["usage"]["prompt_tokens"] == r["prompt_len"]
        and r["usage"]["completion_tokens"] == n
        and r["stream_usage"]["completion_tokens"] == n
        for r in results
    )
    return {"streaming_equal": f"{stream_ok}/{len(results)}", "usage_right": f"{usage_ok}/{len(results)}"}


# --- load -------------------------------------------------------------------------------------------


@dataclass
class Row:
    label: str
    nreq: int
    conc: int
    seconds: float
    out_tok_s: float
    ttft_p50: float
    ttft_p90: float
    itl_p50: float
    itl_p90: float
    errors: int = 0
    notes: list[str] = field(default_factory=list)


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * q))] * 1000 if xs else float("nan")


async def run_load(
    label: str, one, reqs: list[list[int]], osl: int, conc: int, warmup: list[list[int]]
) -> Row:
    """Closed loop at ``conc``: ``one(ids)`` returns (t_sent, [t of each content chunk], n_tokens).
    ``warmup`` prompts (other than ``reqs``, so no measured prompt is in the prefix cache) go first."""
    sem = asyncio.Semaphore(conc)
    ttft, itl, tokens, errors = [], [], [0], [0]

    async def go(ids: list[int], record: bool) -> None:
        async with sem:
            try:
                t0, stamps, n = await one(ids)
            except Exception as e:  # a failed request is counted and named, the run goes on
                errors[0] += 1
                log(f"{label}: request failed: {e!r}")
                return
            if record and stamps:
                ttft.append(stamps[0] - t0)
                if n > 1:
                    itl.append((stamps[-1] - stamps[0]) / (n - 1))
                tokens[0] += n

    await asyncio.gather(*(go(ids, False) for ids in warmup))
    start = time.perf_counter()
    await asyncio.gather(*(go(ids, True) for ids in reqs))
    seconds = time.perf_counter() - start
    row = Row(label, len(reqs), conc, seconds, tokens[0] / seconds, pct(ttft, 0.5), pct(ttft, 0.9),
              pct(itl, 0.5), pct(itl, 0.9), errors[0])  # fmt: skip
    log(f"bench {fmt_row(row)}")
    return row


def ours_stream(session, base: str, osl: int):
    """Our ``/v1/completions`` read as raw SSE with aiohttp, as ``native_stream`` reads SGLang's. Not the
    ``openai`` client: it spends 10-20 ms of client CPU per 2048-id prompt (its request transform) and
    about 40 us per chunk, which would be charged to our side only and serialize in a burst."""

    async def one(ids: list[int]):
        body = {"model": MODEL, "prompt": ids, "max_tokens": osl, "temperature": 0, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
        t0 = time.perf_counter()
        stamps, n = [], 0
        async with session.post(f"{base}/completions", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"our frontend answered {r.status}: {(await r.text())[:200]}")
            async for line in r.content:
                if line.startswith(b"data: {"):
                    event = json.loads(line[6:])
                    if "error" in event:
                        raise RuntimeError(f"our frontend's stream failed: {event['error']}")
                    if any(c.get("text") for c in event.get("choices") or ()):
                        stamps.append(time.perf_counter())
                    if event.get("usage"):
                        n = event["usage"]["completion_tokens"]
        return t0, stamps, n

    return one


def native_stream(session, port: int, osl: int):
    async def one(ids: list[int]):
        body = {"input_ids": ids, "stream": True,
                "sampling_params": {"max_new_tokens": osl, "temperature": 0, "ignore_eos": True}}  # fmt: skip
        t0 = time.perf_counter()
        stamps, n = [], 0
        async with session.post(f"http://127.0.0.1:{port}/generate", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"SGLang answered {r.status}: {(await r.text())[:200]}")
            async for line in r.content:
                if line.startswith(b"data: {"):
                    stamps.append(time.perf_counter())
                    n = json.loads(line[6:])["meta_info"]["completion_tokens"]
        return t0, stamps, n

    return one


def fmt_row(r: Row) -> str:
    return (f"{r.label:28} {r.nreq:4d} {r.conc:4d} {r.seconds:7.2f} {r.out_tok_s:9.0f} {r.ttft_p50:8.0f} "
            f"{r.ttft_p90:8.0f} {r.itl_p50:7.1f} {r.itl_p90:7.1f} {r.errors:4d}")  # fmt: skip


async def benchmarks(prefix: str, ours_session, base: str, native=None) -> list[Row]:
    """The fixed batch and the sweep, ours (our frontend at ``base``, through ``ours_session``) and
    SGLang's own when ``native`` = (session, port), the sides one after the other on the same prompts."""
    rows = []
    sides = [("ours", ours_stream(ours_session, base, OSL))]
    if native is not None:
        sides.append(("native", native_stream(*native, OSL)))
    runs = [("batch", NREQ, prompts(NREQ, ISL, seed=1), prompts(4, ISL, seed=2))]
    for conc in SWEEP:
        runs.append(
            (f"c={conc}", conc, prompts(max(2 * conc, 8), ISL, 100 + conc), prompts(4, ISL, 900 + conc))
        )
    for name, conc, reqs, warmup in runs:
        for side, one in sides:
            rows.append(await run_load(f"{prefix} {side} {name}", one, reqs, OSL, conc, warmup))
    return rows


# --- phases ------------------------------------------------------------------------------------------


async def phase_agg() -> dict:
    import aiohttp
    import openai

    stack = Stack()
    result: dict = {"engine": ENGINE, "graphs": GRAPHS, "flags": SGLANG_FLAGS}
    try:
        stack.start_nats()
        kv_events = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{free_port()}"})
        worker, worker_sys = stack.start_worker("agg", 0, "--kv-events-config", kv_events)
        frontend = stack.start_frontend()
        native = native_port = None
        if ENGINE == "sglang" and GPUS > 1:
            native, native_port = stack.start_native(gpu(1))
        result["agg_ready_s"] = wait_http(worker, f"http://127.0.0.1:{worker_sys}/health")
        log(f"our agg worker ready in {result['agg_ready_s']:.0f}s")
        if ENGINE == "sglang" and GPUS == 1:
            native, native_port = stack.start_native(gpu(1), *second_engine_flags())
        if native is not None:
            result["native_ready_s"] = wait_http(native, f"http://127.0.0.1:{native_port}/health")
            log(f"SGLang's own server ready in {result['native_ready_s']:.0f}s")
        wait_http(frontend, f"http://127.0.0.1:{stack.http_port}/live", 60)
        base = f"http://127.0.0.1:{stack.http_port}/v1"
        await wait_served(base, {"agg"})
        probes = prompts(PROBES, PROBE_LEN, seed=0)
        timeout = aiohttp.ClientTimeout(total=600)
        async with (
            openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0, timeout=600) as client,
            aiohttp.ClientSession(timeout=timeout) as session,
            count_kv_events(stack.nats_port) as kv_batches,
        ):
            ours = []
            for ids in probes:
                r = await ours_once(client, ids, PROBE_OUT)
                ours.append({**r, "prompt_len": len(ids)})
            result["agg_outputs"] = [r["ids"] for r in ours]
            result["agg_checks"] = correctness(ours, PROBE_OUT)
            if native_port is not None:
                theirs = [await native_once(session, native_port, ids, PROBE_OUT) for ids in probes]
                result["native_outputs"] = theirs
                same = sum(a == b for a, b in zip(result["agg_outputs"], theirs, strict=True))
                result["agg_checks"]["greedy_equal_native"] = f"{same}/{len(probes)}"
            log(f"agg checks: {result['agg_checks']}")
            native_side = (session, native_port) if native_port else None
            rows = await benchmarks("agg", session, base, native_side)
            result["rows"] = [asdict(r) for r in rows]
            result["worker_metrics"] = metrics_excerpt(worker_sys)
            result["agg_checks"]["kv_events_relayed"] = "1/1" if kv_batches[0] else "0/1"
            result["agg_checks"]["health_after_load"] = healthy(worker_sys)
            log(f"KV event batches on the event plane: {kv_batches[0]}")
    finally:
        stack.close()
    return result


@contextlib.asynccontextmanager
async def count_kv_events(nats_port: int):
    """Counts the KV event batches our worker publishes on the event plane while the block runs."""
    import nats
    from dynamo_worker.protocol import kv_events_subject

    count = [0]

    async def on_msg(_msg) -> None:
        count[0] += 1

    nc = await nats.connect(f"nats://127.0.0.1:{nats_port}")
    try:
        await nc.subscribe(kv_events_subject(NAMESPACE), cb=on_msg)
        yield count
    finally:
        await nc.close()


def healthy(system_port: int) -> str:
    """1/1 when the worker's /health answers 200 (its last canary passed)."""
    with (
        contextlib.suppress(OSError),
        urllib.request.urlopen(f"http://127.0.0.1:{system_port}/health", timeout=10) as r,
    ):
        return "1/1" if r.status == 200 else "0/1"
    return "0/1"


def metrics_excerpt(system_port: int) -> list[str]:
    with (
        contextlib.suppress(OSError),
        urllib.request.urlopen(f"http://127.0.0.1:{system_port}/metrics", timeout=5) as r,
    ):
        return [
            line
            for line in r.read().decode().splitlines()
            if line.startswith(("dynamo_sglang", "dynamo_worker_kv"))
        ]
    return []


async def phase_disagg(agg: dict | None) -> dict:
    import aiohttp
    import openai

    stack = Stack()
    result: dict = {}
    try:
        stack.start_nats()
        prefill, prefill_sys = stack.start_worker("prefill", 0)  # no bootstrap port: the worker picks one
        frontend = stack.start_frontend()
        if GPUS > 1:
            decode, decode_sys = stack.start_worker("decode", gpu(1))
        result["prefill_ready_s"] = wait_http(prefill, f"http://127.0.0.1:{prefill_sys}/health")
        if GPUS == 1:
            decode, decode_sys = stack.start_worker("decode", gpu(1), *second_engine_flags())
        result["decode_ready_s"] = wait_http(decode, f"http://127.0.0.1:{decode_sys}/health")
        log(f"prefill ready in {result['prefill_ready_s']:.0f}s, decode in {result['decode_ready_s']:.0f}s")
        wait_http(frontend, f"http://127.0.0.1:{stack.http_port}/live", 60)
        base = f"http://127.0.0.1:{stack.http_port}/v1"
        await wait_served(base, {"prefill", "decode"})
        probes = prompts(PROBES, PROBE_LEN, seed=0)
        async with (
            openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0, timeout=600) as client,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session,
        ):
            ours = []
            for ids in probes:
                r = await ours_once(client, ids, PROBE_OUT)
                ours.append({**r, "prompt_len": len(ids)})
            result["disagg_outputs"] = [r["ids"] for r in ours]
            result["disagg_checks"] = correctness(ours, PROBE_OUT)
            if agg is not None:
                same = sum(a == b for a, b in zip(agg["agg_outputs"], result["disagg_outputs"], strict=True))
                result["disagg_checks"]["greedy_equal_agg"] = f"{same}/{len(probes)}"
            log(f"disagg checks: {result['disagg_checks']}")
            rows = await benchmarks("disagg", session, base)
            result["rows"] = [asdict(r) for r in rows]
            result["prefill_metrics"] = metrics_excerpt(prefill_sys)
            result["disagg_checks"]["health_after_load"] = (
                f"{int(healthy(prefill_sys)[0]) + int(healthy(decode_sys)[0])}/2"
            )
            result["kill"] = await kill_prefill_midway(client, prefill)
    finally:
        stack.close()
    return result


async def kill_prefill_midway(client, prefill: Proc) -> dict:
    """Send long prompts at once, SIGKILL the prefill worker while their prefill legs run, and time how
    every request ends: an error, or its completion (its prefill was done), or a hang (a failure)."""
    import openai

    n, isl = int(os.environ.get("KILL_NREQ", 64)), int(os.environ.get("KILL_ISL", 4096))
    reqs = prompts(n, isl, seed=7)
    killed_at: list[float] = []
    ends: list[tuple[str, float, str]] = []

    async def one(ids: list[int]) -> None:
        try:
            stream = await client.completions.create(
                model=MODEL,
                prompt=ids,
                max_tokens=256,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            async for _ in stream:
                pass
            ends.append(("completed", time.monotonic(), ""))
        except openai.APIError as e:
            ends.append(
                ("error", time.monotonic(), f"{type(e).__name__} {getattr(e, 'status_code', '')}: {e}"[:200])
            )

    tasks = [asyncio.create_task(one(ids)) for ids in reqs]
    await asyncio.sleep(float(os.environ.get("KILL_AFTER_S", 0.5)))
    killed_at.append(time.monotonic())
    prefill.kill()
    log(f"killed the prefill worker with {sum(not t.done() for t in tasks)} of {n} requests in flight")
    _, pending = await asyncio.wait(tasks, timeout=KILL_BOUND_S + 5)
    for t in pending:
        t.cancel()
    errors = [e for e in ends if e[0] == "error"]
    latest = max((e[1] - killed_at[0] for e in errors), default=0.0)
    return {
        "requests": n,
        "errors": len(errors),
        "completed": sum(e[0] == "completed" for e in ends),
        "hung": len(pending),
        "latest_error_after_kill_s": round(latest, 2),
        "bound_s": KILL_BOUND_S,
        "error_examples": sorted({e[2] for e in errors})[:3],
        "ok": not pending and bool(errors) and latest <= KILL_BOUND_S,
    }


# --- report -----------------------------------------------------------------------------------------


def summary(agg: dict | None, disagg: dict | None) -> tuple[str, bool]:
    lines = [f"== GPU proof summary: ENGINE={ENGINE} GRAPHS={int(GRAPHS)} ISL={ISL} OSL={OSL} NREQ={NREQ} =="]
    lines.append("SGLang flags (ours and native): " + " ".join(SGLANG_FLAGS))
    ok = True
    checks: list[tuple[str, str]] = []
    for phase, key in ((agg, "agg_checks"), (disagg, "disagg_checks")):
        for name, value in ((phase or {}).get(key) or {}).items():
            checks.append((f"{key.split('_')[0]} {name}", value))
            good, total = value.split("/")
            ok &= good == total
    if disagg and "kill" in disagg:
        k = disagg["kill"]
        verdict = "ok" if k["ok"] else "FAILED"
        latest, bound = k["latest_error_after_kill_s"], k["bound_s"]
        checks.append(
            (
                "disagg prefill killed mid-request",
                f"{verdict}: {k['errors']} errors (latest {latest}s after the kill, bound {bound:.0f}s), "
                f"{k['completed']} completed, {k['hung']} hung",
            )
        )
        ok &= k["ok"]
    if ENGINE == "sglang" and agg is not None and "greedy_equal_native" not in agg.get("agg_checks", {}):
        checks.append(("agg greedy_equal_native", "not run"))
        ok = False
    lines += ["", f"{'check':40} result"] + [f"{c:40} {v}" for c, v in checks]
    rows = [Row(**r) for p in (agg, disagg) if p for r in p.get("rows", [])]
    header = (f"{'run':28} {'req':>4} {'conc':>4} {'seconds':>7} {'out tok/s':>9} {'TTFT p50':>8} "
              f"{'TTFT p90':>8} {'ITL p50':>7} {'ITL p90':>7} {'err':>4}   (ms)")  # fmt: skip
    lines += ["", header]
    lines += [fmt_row(r) for r in rows]
    by_label = {r.label: r for r in rows}
    ratios = []
    for r in rows:
        if " ours " in r.label and r.label.startswith("agg"):
            theirs = by_label.get(r.label.replace(" ours ", " native "))
            if theirs and theirs.out_tok_s > 0:
                name = r.label.replace("agg ours ", "")
                ratios.append(
                    f"{name:10} throughput {r.out_tok_s / theirs.out_tok_s:5.2f}x  "
                    f"TTFT p50 {r.ttft_p50 / theirs.ttft_p50:5.2f}x  "
                    f"ITL p50 {r.itl_p50 / theirs.itl_p50:5.2f}x"
                )
    if ratios:
        lines += [
            "",
            "ours / SGLang native (aggregated, same flags; >1 throughput is better, <1 latency is better)",
        ]
        lines += ratios
    ok &= all(r.errors == 0 for r in rows)
    lines += ["", f"RESULT: {'PASS' if ok else 'FAIL'}"]
    return "\n".join(lines), ok


def main(argv: list[str]) -> int:
    phase = argv[1] if len(argv) > 1 else "all"
    if phase not in ("agg", "disagg", "all"):
        print(__doc__)
        return 2
    # SIGTERM (a time limit, Ctrl-C's cousin) unwinds like an error, so every process gets stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    OUT.mkdir(parents=True, exist_ok=True)
    STATE.mkdir(parents=True, exist_ok=True)
    if not (MODEL_DIR / "tokenizer.json").is_file():
        make_model(MODEL_DIR)
    agg = disagg = None
    state = STATE / "agg.json"
    try:
        if phase in ("agg", "all"):
            agg = asyncio.run(phase_agg())
            state.write_text(json.dumps(agg))
            (OUT / "agg.json").write_text(json.dumps(agg, indent=1))
        elif state.is_file():
            agg = json.loads(state.read_text())
        else:
            log(f"no results of phase agg in {state}: greedy outputs are not compared (run 'agg' first)")
        if phase in ("disagg", "all"):
            disagg = asyncio.run(phase_disagg(agg))
            (OUT / "disagg.json").write_text(json.dumps(disagg, indent=1))
    except Exception as e:  # the run ends with its reason and the summary of what did run
        log(f"FAILED: {e}")
        text, _ = summary(agg, disagg)
        text = text.rsplit("RESULT:", 1)[0] + f"RESULT: FAIL ({e})"
        print(text, flush=True)
        (OUT / "summary.txt").write_text(text)
        return 1
    text, ok = summary(agg, disagg)
    (OUT / "summary.txt").write_text(text)
    print(text, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
