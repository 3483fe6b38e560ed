"""Disaggregation that pays: our stack against SGLang's own gateway (``smg``) on the same GPUs.

usage: python3 tests/gpu/run_peers.py [STACK ...]
       python3 tests/gpu/run_peers.py report [DIR]   (the report of the peers-*.json in DIR, again)
  stacks: ours-agg, ours-disagg, smg-agg, smg-pd (default: all four)

On one machine, one stack after the other, with the same SGLang flags (``run_examples.USER_FLAGS`` and
``EXTRA_FLAGS``, the 8B-shaped dummy model), workloads and client:

1. ``ours-agg``: ``dynamo-run`` of examples/agg-router.yaml with N workers (kv routing, KV events);
2. ``ours-disagg``: ``dynamo-run`` of examples/disagg-router.yaml with P prefill + D decode workers (NIXL);
3. ``smg-agg``: N ``sglang.launch_server`` processes behind ``smg launch --policy cache_aware``;
4. ``smg-pd``: P prefill + D decode ``sglang.launch_server`` processes behind ``smg launch
   --pd-disaggregation`` (the same transfer backend, NIXL).

N = P + D = the GPUs given (``GRAPH_GPUS``, default every visible GPU); ``SPLIT`` sets P (default N/2: 1P1D
on 2 GPUs, 2P2D on 4; ``SPLIT=1`` gives 1P3D). Every engine sees only its own GPU. ``EXTRA_FLAGS`` go to
every SGLang engine of both stacks (e.g. ``--enable-request-time-stats-logging``, which
``time_stats.py`` reads); ``FRONTEND_ARGS`` to our frontend (e.g. ``--router-mode round-robin``, which
also leaves the workers' KV events off, as the operator does).

Workloads (``WORKLOADS``): ``rag`` (8192 prompt ids / 256 out), ``chat`` (2048 / 512), ``multiturn``
(conversations whose prompt grows by one turn each time over a shared system prompt: the prefix cache
and cache-aware routing matter), ``longmultiturn`` (many concurrent conversations, their turns
interleaved, whose KV in all is ``LONG_KV_FACTOR`` (3.5) times the GPUs' KV cache: each caching
engine's cache (aggregated and prefill; a disaggregated decode engine caches nothing and keeps its whole
memory) is cut to ``LONG_POOL_TOKENS`` tokens with ``--max-total-tokens``, the conversations are counted
to fill 3.5 times that per GPU, and the sizing is printed; between two turns of a conversation every other one
takes a turn, so its KV has left the GPU when it returns: HiCache's host tier and tier-aware routing
matter), ``trace`` (a window of the Mooncake conversation trace replayed open loop at its timestamps,
``peers_trace.py``: ``TRACE_FILE``, ``TRACE_COUNT`` 300, ``TRACE_SPEEDUPS`` 1,2,4,8 in place of the
concurrency sweep, a point's ``conc`` being its speedup; the served context becomes 131072 for its long
prompts; each point notes the share of requests within TTFT 2 s and ITL 25 ms each, Dynamo's SLO for
this trace). Each is swept over concurrency (``SWEEP``; longmultiturn from c8 up) until TTFT p90 or ITL
p90 passes its SLO (``TTFT_SLO_MS`` 2000, ``ITL_SLO_MS`` 50; the first point past it is kept); goodput
is reported at those SLOs and beside them at a tight ITL SLO (``TIGHT_ITL_SLO_MS``, 10 ms), where
disaggregation should pay. Recorded per point: output tokens/s per GPU, TTFT p50/p90, ITL p50/p90 (per
request: (last - first token) / (n - 1)), the cached share of prompt tokens and of it the share loaded
from host memory (ours: the frontend's ``dynamo_frontend_cached_tokens_host``; SGLang: its
``meta_info.cached_tokens_details``), the most of them any router could find cached (``cacheable_share``:
what the point's earlier prompts shared with each, the table's ``max``), errors. Ours is driven through
``/v1/completions`` with token-id prompts, the gateway through SGLang's ``/generate`` with ``input_ids``;
both stream and both count the server's own usage. Both get the same sampling: ``TEMPERATURE`` (default 0,
greedy, as every other GPU script sends; each point records it). Points measured before 2026-11-29 sent
ours no temperature, so ours sampled at the OpenAI default of 1 (a softmax and a draw over the vocabulary
every decode step) while the gateway's engines decoded greedily.

Model shape (``MODEL_SHAPE``): ``8b`` (default, ``tests/gpu/model``: Llama 3 8B, hidden 4096, 32 layers)
or ``1b`` (hidden 2048, intermediate 8192, 16 layers, 32 heads, 8 KV heads: a decode step of about 2 ms
on an H200, where what our stack adds per request and per token shows); both dummy weights, written
into ``MODEL_DIR``. Every point records its shape (``model_shape``, ``hidden_size``, ``layers``), so
points of both shapes share a report (goodput and ratios per workload and shape).

Engine flags, the same for both stacks: ``HICACHE=1`` adds SGLang's hierarchical cache
(``--enable-hierarchical-cache --hicache-ratio HICACHE_RATIO`` (4) ``--hicache-write-policy
write_through``; without longmultiturn's cut KV cache, ``--hicache-size``: half the machine's memory over
the GPUs, or ``HICACHE_SIZE_GB``) to the aggregated and prefill engines (a disaggregated decode engine
keeps no prefix cache, and SGLang refuses HiCache there; each prefill engine gets N / P GPUs' worth, so
the layout's host tier is as large as the aggregated one's), and longmultiturn adds its
``--max-total-tokens`` to the same engines (``role_flags``).
``HOST_WEIGHT=0`` gives our frontend ``--kv-host-hit-weight 0 --kv-disk-hit-weight 0`` (GPU-only routing,
the baseline of tier-aware routing); its stacks are named ``ours-agg-hw0`` etc. so both kinds of points
can share a report.

A stack pair per device call keeps each call inside its 10 minutes (``ours-disagg smg-pd``, then
``ours-agg smg-agg``; ``STACK_BUDGET_S`` stops a stack's sweep before a point that would start too
late): each stack's points wait in ``$GPU_STATE`` (and ``$OUT/peers-STACK.json``) and the report covers
every call so far. Each stack's engines start with empty compile caches of their own (``JIT_CACHE``,
``fresh``; ``shared``: the machine's), so the stack measured second does not find the first one's
kernels compiled (on 2026-12-03 that alone moved the 1B multiturn c16 TTFT p90 tail between stacks).
Prints the table, then per workload the goodput per GPU at the SLOs (the best tokens/s per GPU of a
point within both) of every stack and the ratios ours / smg, and writes ``$OUT/peers.json`` and
``$OUT/peers.png`` (tokens/s per GPU against ITL p90, and below against TTFT p90, one column per
workload). ``ENGINE=mocker`` runs
the stacks on the simulated engine, which checks the script without a GPU: ours as above, and
``smg-agg`` as the real gateway in front of N mocker engines that serve SGLang's HTTP API
(``dynamo_worker.mocker.sglang_http``) with the same flags and model folder as our mocker workers
(``smg_server``); ``smg-pd`` is skipped there (SGLang's PD bootstrap protocol is not simulated).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import peers_trace  # noqa: E402  (the trace workload)
import run_examples as ex  # noqa: E402  (the same Graph, flags and model as the user-path proof)

OUT = ex.OUT
STATE = Path(
    os.environ.get("GPU_STATE") or "/tmp/dynamo-gpu-state"
)  # results of earlier calls on this machine
SWEEP = [int(c) for c in os.environ.get("SWEEP", "1,4,16,64,128,256").split(",") if c]
WORKLOADS = os.environ.get("WORKLOADS", "rag,chat,multiturn").split(",")
TTFT_SLO_MS = float(os.environ.get("TTFT_SLO_MS", 2000))
ITL_SLO_MS = float(os.environ.get("ITL_SLO_MS", 50))
TIGHT_ITL_SLO_MS = float(os.environ.get("TIGHT_ITL_SLO_MS", 10))  # reported beside the SLOs above
HICACHE = os.environ.get("HICACHE", "0") == "1"
HICACHE_RATIO = os.environ.get("HICACHE_RATIO", "4")
HOST_WEIGHT = os.environ.get("HOST_WEIGHT")  # ours: --kv-host-hit-weight (and disk), e.g. 0 for GPU-only
LONG_POOL_TOKENS = int(os.environ.get("LONG_POOL_TOKENS", 24576))  # longmultiturn: --max-total-tokens
LONG_KV_FACTOR = float(os.environ.get("LONG_KV_FACTOR", 3.5))  # its KV in all / the GPUs' KV caches'
LONG_MIN_CONC = 8  # longmultiturn's many conversations need clients enough to finish a point in time
REQ_PER_CONC = int(os.environ.get("REQ_PER_CONC", 3))  # requests per point: conc x this ...
MIN_REQ = int(os.environ.get("MIN_REQ", 8))  # ... and at least this many
TEMPERATURE = float(os.environ.get("TEMPERATURE", 0))  # both stacks' requests: the same sampling
# A device call lasts at most 10 minutes: STACK_BUDGET_S seconds after a stack begins to start, no new point
# of it begins (the points measured so far are kept and reported, with a note on the sweep cut short).
STACK_BUDGET_S = float(os.environ.get("STACK_BUDGET_S", "inf"))
CONTEXT = 16384  # rag's 8192 + 256 needs more than the 8192 of the model's config
if "trace" in WORKLOADS:  # the Mooncake trace's prompts run to ~125k tokens (a third of them past 16384)
    CONTEXT = 131072
PAGE_SIZE = 16  # every engine's --page-size: the gateway's engines get it here, ours from the examples
STACKS = ("ours-agg", "ours-disagg", "smg-agg", "smg-pd")
# config.json fields over tests/gpu/model's (the 8B shape) per MODEL_SHAPE
MODEL_SHAPES: dict[str, dict[str, int]] = {
    "8b": {},
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
           "num_attention_heads": 32, "num_key_value_heads": 8},
}  # fmt: skip
MODEL_SHAPE = os.environ.get("MODEL_SHAPE", "8b")


@dataclass(frozen=True)
class Workload:
    name: str
    isl: int  # rag/chat: the prompt; multiturn: the shared system prompt; longmultiturn: each one's document
    osl: int
    turns: int = 1  # multiturn: each conversation sends this many requests, the prompt growing each time
    user: int = 0  # tokens of user text a turn adds (0: isl // 2)
    system: int = 0  # longmultiturn: a system prompt shared by every conversation, before its document
    interleaved: bool = False  # longmultiturn: conversations take turns, one turn at a time

    @property
    def final_context(self) -> int:
        """Tokens of a conversation's last turn with its answer."""
        return self.system + self.isl + self.turns * ((self.user or self.isl // 2) + self.osl)


SHAPES = {
    "rag": Workload("rag", 8192, 256),
    "chat": Workload("chat", 2048, 512),
    "multiturn": Workload("multiturn", 1024, 128, turns=4),  # 1024 shared + 512 per turn
    # 512 shared + a 1536-token document + 4 turns of 256 user + 64 answer: 3328 tokens in the end
    "longmultiturn": Workload("longmultiturn", 1536, 64, turns=4, user=256, system=512, interleaved=True),
}
if os.environ.get("SMALL"):  # the mocker check: the same shapes, scaled down
    SHAPES = {
        k: replace(
            w, isl=max(64, w.isl // 64), osl=max(8, w.osl // 32), user=w.user // 32, system=w.system // 32
        )
        for k, w in SHAPES.items()
    }


def long_conversations(w: Workload, gpus: int) -> int:
    """How many conversations longmultiturn runs: their KV in all (the shared system prompt once) is
    LONG_KV_FACTOR x the GPUs' caches."""
    own = w.final_context - w.system
    return -(-(int(LONG_KV_FACTOR * LONG_POOL_TOKENS * gpus) - w.system) // own)


def long_sizing(gpus: int) -> str:
    w = SHAPES["longmultiturn"]
    n = long_conversations(w, gpus)
    total = n * (w.final_context - w.system) + w.system
    host = (
        f", host memory {HICACHE_RATIO}x that (HiCache; a disaggregated layout's prefill engines hold it all)"
        if HICACHE
        else ", no host tier (HICACHE=0)"
    )
    pool = LONG_POOL_TOKENS * gpus
    return (
        f"longmultiturn sizing: {n} conversations x {w.final_context} tokens in the end ({w.turns} turns) "
        f"= {total} tokens of KV; each engine's KV cache {LONG_POOL_TOKENS} tokens (--max-total-tokens; "
        f"not a disaggregated decode engine's) x {gpus} GPUs = {pool}: {total / pool:.1f}x{host}"
    )


@dataclass
class Point:
    stack: str
    workload: str
    conc: int
    gpus: int
    requests: int = 0
    seconds: float = 0.0
    out_tok_s_per_gpu: float = 0.0
    ttft_p50: float = float("nan")
    ttft_p90: float = float("nan")
    itl_p50: float = float("nan")
    itl_p90: float = float("nan")
    cached_share: float = 0.0
    errors: int = 0
    notes: list[str] = field(default_factory=list)
    cached_share_host: float | None = None  # of the prompt tokens, those loaded from host memory (when told)
    # the most of them any router finds cached (``cacheable_share``; None: points before 2026-12-01)
    cacheable_share: float | None = None
    temperature: float | None = None  # what every request asked (None: before 2026-11-29, see above)
    model_shape: str = "8b"  # MODEL_SHAPE (points before 2026-12-01: the 8B shape)
    hidden_size: int | None = None  # the served config.json's (None: before 2026-12-01)
    layers: int | None = None

    @property
    def within_slo(self) -> bool:
        return self.within(TTFT_SLO_MS, ITL_SLO_MS)

    def within(self, ttft_ms: float, itl_ms: float) -> bool:
        return self.errors == 0 and self.ttft_p90 <= ttft_ms and self.itl_p90 <= itl_ms


def shape_fields() -> dict[str, object]:
    """What a point records of the model it served: MODEL_SHAPE and the config.json's figures."""
    config = json.loads((ex.MODEL_DIR / "config.json").read_text())
    return {"model_shape": MODEL_SHAPE, "hidden_size": config["hidden_size"],
            "layers": config["num_hidden_layers"]}  # fmt: skip


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * q))] * 1000 if xs else float("nan")


# --- requests ------------------------------------------------------------------------------------------


def conversations(w: Workload, count: int, seed: int) -> list[list[list[int]]]:
    """``count`` request sequences: one prompt each for rag/chat; for multiturn a shared system prompt
    plus per-turn user text and a stand-in for the previous answer, growing turn by turn; longmultiturn
    the same over a shared system prompt and a document of each conversation's own."""
    rng = random.Random(seed)
    top = 800 if ex.ENGINE != "sglang" else 30000  # the mocker's tiny tokenizer has 825 ids
    ids = lambda n: [rng.randrange(100, top) for _ in range(n)]  # noqa: E731
    if w.turns == 1:
        return [[ids(w.isl)] for _ in range(count)]
    system = ids(w.system) if w.system else ids(w.isl)
    out = []
    for _ in range(count):
        history, turns = [*system, *(ids(w.isl) if w.system else [])], []
        for _ in range(w.turns):
            history += ids(w.user or w.isl // 2)
            turns.append(list(history))
            history += ids(w.osl)  # the previous answer, resent by the client
        out.append(turns)
    return out


def cacheable_share(convs: list[list[list[int]]], page: int = PAGE_SIZE) -> float:
    """The share of these prompt tokens that a cache holding every earlier prompt would find: the
    leading whole pages of each prompt that an earlier one began with (a turn's previous turn, the
    shared system prompt). The most any router can find cached, as if one engine of unbounded memory
    served them all: the answers the clients resend are stand-ins, not what the engine generated, so a
    turn finds its previous prompt cached and not that prompt's answer."""
    seen: set[int] = set()  # a chained hash for every page-aligned prefix sent so far
    total = found = 0
    for prompt in (p for turns in convs for p in turns):  # a conversation's turns in order
        chain, hit = 0, True
        for end in range(page, len(prompt) + 1, page):
            chain = hash((chain, tuple(prompt[end - page : end])))
            hit = hit and chain in seen
            found += page if hit else 0
            seen.add(chain)
        total += len(prompt)
    return found / total if total else 0.0


def ours_request(session, base: str, osl: int, model: str):
    """One streamed completion: (start, token stamps, output tokens, cached tokens, None: the host
    share comes from the frontend's counter, see ``host_counter``)."""

    async def one(prompt: list[int]) -> tuple[float, list[float], int, int, int | None]:
        body = {"model": model, "prompt": prompt, "max_tokens": osl, "stream": True, "ignore_eos": True,
                "temperature": TEMPERATURE, "stream_options": {"include_usage": True}}  # fmt: skip
        t0, stamps, n, cached = time.perf_counter(), [], 0, 0
        async with session.post(f"{base}/completions", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"{r.status}: {(await r.text())[:200]}")
            async for line in r.content:
                if not line.startswith(b"data: {"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(str(event["error"])[:200])
                if any(c.get("text") for c in event.get("choices") or ()):
                    stamps.append(time.perf_counter())
                if usage := event.get("usage"):
                    n = usage["completion_tokens"]
                    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return t0, stamps, n, cached, None

    return one


def host_counter(base: str):
    """Our frontend's ``dynamo_frontend_cached_tokens_host`` (all models): the prompt tokens its workers
    loaded from host memory so far."""

    def read() -> float:
        url = base.removesuffix("/v1") + "/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        found = re.findall(r"^dynamo_frontend_cached_tokens_host_total(?:{[^}]*})? (\S+)$", text, re.M)
        return sum(float(v) for v in found)

    return read


def smg_request(session, base: str, osl: int, model: str):
    """One streamed ``/generate``: (start, token stamps, output tokens, cached tokens, of them loaded from
    host memory or storage per ``meta_info.cached_tokens_details``)."""

    async def one(prompt: list[int]) -> tuple[float, list[float], int, int, int | None]:
        sampling = {"max_new_tokens": osl, "temperature": TEMPERATURE, "ignore_eos": True}
        body = {"input_ids": prompt, "stream": True, "sampling_params": sampling}
        t0, stamps, n, cached, host = time.perf_counter(), [], 0, 0, 0
        async with session.post(f"{base}/generate", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"{r.status}: {(await r.text())[:200]}")
            async for line in r.content:
                if line.startswith(b"data: {"):
                    meta = json.loads(line[6:]).get("meta_info") or {}
                    stamps.append(time.perf_counter())
                    n, cached = meta.get("completion_tokens", n), meta.get("cached_tokens", cached)
                    details = meta.get("cached_tokens_details") or {}
                    host = (
                        int(details.get("host") or 0) + int(details.get("storage") or 0) if details else host
                    )
        return t0, stamps, n, cached, host

    return one


async def measure(stack: str, gpus: int, w: Workload, conc: int, one, host_total=None) -> Point:
    """``conc`` clients at once (closed loop), each running a conversation's turns in order; with
    ``w.interleaved`` a client sends one turn and puts the conversation back at the end of the line, so
    every other conversation takes a turn before its next one. ``host_total``: a reading of the server's
    host-loaded prompt tokens so far, where requests do not tell them."""
    seed = zlib.crc32(f"{w.name}/{conc}".encode())  # the same prompts for every stack
    requests = max(MIN_REQ, conc * REQ_PER_CONC)
    count = long_conversations(w, gpus) if w.interleaved else max(conc, -(-requests // w.turns))
    convs = conversations(w, count, seed)  # every client has a conversation
    queue: asyncio.Queue[list[list[int]]] = asyncio.Queue()
    for c in convs:
        queue.put_nowait(c)
    ttft, itl, tokens, prompt_tokens, cached, host, errors = [], [], [0], [0], [0], [0], [0]

    async def send(prompt: list[int]) -> None:
        try:
            t0, stamps, n, hit, from_host = await one(prompt)
        except Exception as e:  # counted and named; the point goes on
            errors[0] += 1
            if errors[0] <= 3:
                ex.log(f"{stack} {w.name} c={conc}: request failed: {e}")
            return
        if stamps:
            ttft.append(stamps[0] - t0)
            if n > 1 and len(stamps) > 1:
                itl.append((stamps[-1] - stamps[0]) / (n - 1))
        tokens[0] += n
        prompt_tokens[0] += len(prompt)
        cached[0] += hit
        host[0] += from_host or 0

    async def client() -> None:
        while not queue.empty():
            turns = queue.get_nowait()
            if not w.interleaved:
                for prompt in turns:
                    await send(prompt)
                continue
            await send(turns[0])
            if len(turns) > 1:
                queue.put_nowait(turns[1:])

    host_before = await asyncio.to_thread(host_total) if host_total else 0.0
    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(conc)))
    seconds = time.perf_counter() - start
    if host_total:
        host[0] = int(await asyncio.to_thread(host_total) - host_before)
    share = lambda x: x / prompt_tokens[0] if prompt_tokens[0] else 0.0  # noqa: E731
    point = Point(stack, w.name, conc, gpus, sum(len(c) for c in convs), seconds, tokens[0] / seconds / gpus,
                  pct(ttft, 0.5), pct(ttft, 0.9), pct(itl, 0.5), pct(itl, 0.9), share(cached[0]), errors[0],
                  cached_share_host=share(host[0]), temperature=TEMPERATURE,
                  cacheable_share=cacheable_share(convs), **shape_fields())  # fmt: skip
    ex.log(f"{fmt(point)}")
    return point


async def sweep(stack: str, gpus: int, base: str, kind: str, model: str, deadline: float) -> list[Point]:
    import aiohttp

    points = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        for name in WORKLOADS:
            if name == "trace":
                points += await trace_points(stack, gpus, session, base, kind, model, deadline)
                continue
            w = SHAPES[name]
            one = (ours_request if kind == "ours" else smg_request)(session, base, w.osl, model)
            host_total = host_counter(base) if kind == "ours" else None
            await measure(
                stack, gpus, Workload(f"{w.name}-warm", 64, 4), 2, one
            )  # warm the path, not measured
            for conc in [c for c in SWEEP if not w.interleaved or c >= min(LONG_MIN_CONC, max(SWEEP))]:
                if time.monotonic() > deadline:
                    ex.log(f"{stack} {w.name}: past STACK_BUDGET_S={STACK_BUDGET_S:.0f}s, no c={conc}")
                    if points:
                        points[-1].notes.append(f"sweep cut short by STACK_BUDGET_S before c={conc}")
                    break
                point = await measure(stack, gpus, w, conc, one, host_total)
                points.append(point)
                save_points(stack, points)  # a call killed at its limit still brings back what it measured
                if not point.within_slo:
                    break
    return points


def trace_plan() -> peers_trace.TracePlan:
    """The trace workload's window and prompts, the same for every stack (``peers_trace``)."""
    top = 800 if ex.ENGINE != "sglang" else 30000  # as ``conversations``: the mocker's tiny tokenizer
    return peers_trace.plan(peers_trace.trace.load(peers_trace.TRACE_FILE), context=CONTEXT, top=top)


async def trace_points(stack: str, gpus: int, session, base: str, kind: str, model: str, deadline: float):
    """The ``trace`` workload: the window replayed once per speedup (a point each, ``conc`` = the
    speedup) until a point is past the SLO; each notes its share of requests within Dynamo's per-request
    SLO (TTFT 2 s, ITL 25 ms)."""
    p = trace_plan()
    ex.log(p.describe())
    sender = ours_request if kind == "ours" else smg_request
    host_total = host_counter(base) if kind == "ours" else None
    points: list[Point] = []
    for speedup in p.speedups:
        if time.monotonic() > deadline:
            ex.log(f"{stack} trace: past STACK_BUDGET_S={STACK_BUDGET_S:.0f}s, no speedup {speedup:g}")
            break
        host_before = await asyncio.to_thread(host_total) if host_total else 0.0
        r = await peers_trace.replay(p, speedup, lambda osl: sender(session, base, osl, model))
        host = int(await asyncio.to_thread(host_total) - host_before) if host_total else r.host_tokens
        itl = [x for x in r.itl_s if x is not None]
        prompt = max(1, r.prompt_tokens)
        good = peers_trace.good_share(r)
        notes = [f"speedup {speedup:g}; within TTFT 2 s and ITL 25 ms per request: {good:.2f}"]
        notes += [f"{p.dropped} requests longer than the context left out"] if p.dropped else []
        notes += [f"first error: {r.first_error}"] if r.first_error else []
        point = Point(stack, "trace", max(1, round(speedup)), gpus, len(p.window), r.seconds,
                      r.output_tokens / r.seconds / gpus, pct(r.ttft_s, 0.5), pct(r.ttft_s, 0.9),
                      pct(itl, 0.5), pct(itl, 0.9), r.cached_tokens / prompt, r.errors, notes,
                      cached_share_host=host / prompt, cacheable_share=p.cacheable_share,
                      temperature=TEMPERATURE, **shape_fields())  # fmt: skip
        ex.log(f"{fmt(point)}  ({notes[0]})")
        points.append(point)
        save_points(stack, points)
        if not point.within_slo:
            break
    return points


# --- stacks ------------------------------------------------------------------------------------------

MODEL = "Qwen/Qwen3-0.6B"  # the examples' served name; the gateway's servers serve the same folder as it


def ours_manifest(kind: str, prefill: int, decode: int, folder: Path) -> Path:
    """examples/agg-router.yaml or disagg-router.yaml with the replicas of this machine."""
    example = "examples/agg-router.yaml" if kind == "agg" else "examples/disagg-router.yaml"
    graph = yaml.safe_load((ex.ROOT / example).read_text())
    for svc in graph["spec"]["services"].values():
        role = svc.get("subComponentType")
        if svc.get("componentType") == "worker":
            svc["replicas"] = prefill + decode if kind == "agg" else prefill if role == "prefill" else decode
            main = svc["extraPodSpec"]["mainContainer"]
            share = (prefill + decode) / prefill
            main["args"] = [*main.get("args", []), *role_flags("agg" if kind == "agg" else role, share)]
    path = folder / f"ours-{kind}.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(graph, sort_keys=False))
    frontend = (
        ["--kv-host-hit-weight", HOST_WEIGHT, "--kv-disk-hit-weight", HOST_WEIGHT] if HOST_WEIGHT else []
    )
    # an absolute path: read from there, written back there; FRONTEND_ARGS (e.g. --router-mode round-robin)
    return ex.user_manifest(str(path), folder, [*frontend, *ex.FRONTEND_ARGS])


class Processes:
    """SGLang servers and the gateway as processes of their own sessions, all stopped by ``close``."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.logs = OUT / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, argv: list[str], gpu: str | None = None) -> subprocess.Popen:
        env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {})}
        out = (self.logs / f"{name}.log").open("w")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(1.0, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.procs.clear()


def wait_ok(url: str, proc: subprocess.Popen, name: str, limit_s: float = ex.STARTUP_S) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited rc={proc.returncode}; see {OUT / 'logs' / (name + '.log')}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=3) as r:
            if r.status == 200:
                return
        time.sleep(1)
    raise RuntimeError(f"{name} not ready at {url} within {limit_s:.0f}s")


def smg_server(flags: list[str]) -> list[str]:
    """The command of one of the gateway's servers: SGLang's; on the mocker, the simulated engine behind
    SGLang's HTTP API (``dynamo_worker.mocker.sglang_http``) with the flags SGLang gets and the model
    folder dynamo-run gives our mocker workers (its tokenizer and KV bytes per token), so that both stacks
    simulate the same engine."""
    if ex.ENGINE == "sglang":
        return [sys.executable, "-m", "sglang.launch_server", *flags]
    from dynamo_worker.runtime.settings import cache_root
    from dynamo_worker.tinymodel import ensure_tiny_model

    tiny = ensure_tiny_model(cache_root() / "tiny-model")  # dynamo-run's mocker folder (local.run)
    return [sys.executable, "-m", "dynamo_worker.mocker.sglang_http", *flags, "--model-dir", str(tiny)]


def smg_stack(procs: Processes, pd: bool, gpus: list[str], prefill: int) -> str:
    """SGLang's servers (one per GPU; see ``smg_server``) and the gateway in front of them; the gateway's
    base URL."""
    flags = [*ex.USER_FLAGS, *ex.EXTRA_FLAGS, "--page-size", str(PAGE_SIZE), "--context-length", str(CONTEXT),
             "--host", "127.0.0.1", "--model-path", str(ex.MODEL_DIR),
             "--served-model-name", MODEL]  # fmt: skip
    servers = []
    for i, gpu in enumerate(gpus):
        role = ("prefill" if i < prefill else "decode") if pd else "agg"
        port, argv = ex.free_port(), smg_server([*flags, *role_flags(role, len(gpus) / prefill)])
        argv += ["--port", str(port)]
        boot = None
        if pd:
            boot = ex.free_port()
            argv += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "nixl"]
            argv += ["--disaggregation-bootstrap-port", str(boot)] if role == "prefill" else []
        name = f"sglang-{role}-{i}"
        servers.append((role, port, boot, procs.start(name, argv, gpu), name))
    for _, port, _, proc, name in servers:
        wait_ok(f"http://127.0.0.1:{port}/health", proc, name)
    router = ex.free_port()
    argv = [sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(router)]
    argv += ["--prometheus-port", str(ex.free_port())]  # its default, 29000, may be taken by another run
    if pd:
        argv += ["--pd-disaggregation", "--policy", "cache_aware"]
        for role, port, boot, _, _ in servers:
            argv += (["--prefill", f"http://127.0.0.1:{port}", str(boot)] if role == "prefill"
                     else ["--decode", f"http://127.0.0.1:{port}"])  # fmt: skip
    else:
        argv += [
            "--policy",
            "cache_aware",
            "--worker-urls",
            *(f"http://127.0.0.1:{p}" for _, p, _, _, _ in servers),
        ]
    gateway = procs.start("smg", argv)
    wait_ok(f"http://127.0.0.1:{router}/health", gateway, "smg", 120)
    base = f"http://127.0.0.1:{router}"
    wait_served(base, gateway)
    return base


def wait_served(base: str, gateway: subprocess.Popen, limit_s: float = 120) -> None:
    """The gateway answers /health before it has registered its workers (a background job that checks
    each one): until then a request gets 503 no_available_workers. Wait for one small request to pass."""
    body = json.dumps({"input_ids": list(range(100, 116)), "sampling_params": {"max_new_tokens": 1}}).encode()
    deadline, last = time.monotonic() + limit_s, ""
    while time.monotonic() < deadline:
        if gateway.poll() is not None:
            raise RuntimeError(f"smg exited rc={gateway.returncode}; see {OUT / 'logs' / 'smg.log'}")
        request = urllib.request.Request(f"{base}/generate", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                if r.status == 200:
                    return
        except urllib.error.HTTPError as e:
            last = f"{e.code}: {e.read()[:200]!r}"
        except OSError as e:
            last = str(e)
        time.sleep(1)
    raise RuntimeError(f"smg did not serve a request within {limit_s:.0f}s (last: {last})")


# fresh: each stack its own empty compile caches (see the module docstring); shared: the machine's
JIT_CACHE = os.environ.get("JIT_CACHE", "fresh")


def fresh_jit_caches(stack: str) -> None:
    """Empty compile caches for ``stack``'s processes (``JIT_CACHE``), in the environment they inherit."""
    if JIT_CACHE != "shared":
        os.environ.update(ex.cold_caches(stack))


def run_stack(stack: str, gpus: list[str], prefill: int) -> list[Point]:
    ex.log(f"=== {stack} on GPUs {','.join(gpus)}")
    fresh_jit_caches(stack)
    deadline = time.monotonic() + STACK_BUDGET_S
    if stack.startswith("ours"):
        kind = stack.split("-")[1]  # agg or disagg (ours-agg, ours-agg-hw0, ...)
        decode = len(gpus) - prefill
        manifest = ours_manifest(kind, prefill, decode, OUT / "manifests")
        graph = ex.Graph(stack, manifest, ",".join(gpus))
        try:
            return asyncio.run(sweep(stack, len(gpus), graph.base, "ours", graph.model, deadline))
        finally:
            graph.stop()
    procs = Processes()
    try:
        base = smg_stack(procs, stack == "smg-pd", gpus, prefill)
        return asyncio.run(sweep(stack, len(gpus), base, "smg", MODEL, deadline))
    finally:
        procs.close()


# --- report ------------------------------------------------------------------------------------------


def fmt(p: Point) -> str:
    share = lambda x: "     -" if x is None else f"{x:6.2f}"  # noqa: E731
    return (f"{p.stack:14} {p.model_shape:3} {p.workload:13} {p.conc:4d} {p.requests:4d} "
            f"{p.out_tok_s_per_gpu:8.0f} "
            f"{p.ttft_p50:8.0f} {p.ttft_p90:8.0f} {p.itl_p50:6.1f} {p.itl_p90:6.1f} {p.cached_share:6.2f} "
            f"{share(p.cacheable_share)} {share(p.cached_share_host)} {p.errors:3d}"
            f"{'' if p.within_slo else '  past SLO'}")  # fmt: skip


def goodput(
    points: list[Point], stack: str, workload: str, itl_ms: float = ITL_SLO_MS, shape: str | None = None
) -> float:
    ok = [
        p.out_tok_s_per_gpu
        for p in points
        if p.stack == stack
        and p.workload == workload
        and (shape is None or p.model_shape == shape)
        and p.within(TTFT_SLO_MS, itl_ms)
    ]
    return max(ok, default=0.0)


# (ours, theirs): the ratios the report prints, where both were measured
PAIRS = (
    ("ours-disagg", "smg-pd"),
    ("ours-agg", "smg-agg"),
    ("ours-disagg", "ours-agg"),
    ("ours-agg", "ours-agg-hw0"),  # tier-aware against GPU-only routing (HOST_WEIGHT=0)
    ("ours-disagg", "ours-disagg-hw0"),
)


def report(points: list[Point]) -> str:
    lines = [f"{'stack':14} {'shape':3} {'workload':13} {'conc':>4} {'req':>4} {'tok/s/GPU':>8} "
             f"{'TTFT50':>8} "
             f"{'TTFT90':>8} {'ITL50':>6} {'ITL90':>6} {'cached':>6} {'max':>6} {'host':>6} {'err':>3}   "
             "(ms; cached: the share of prompt tokens found cached, max: the most any router could find, "
             "host: the share loaded from host memory)"]  # fmt: skip
    lines += [fmt(p) for p in points]
    long_gpus = sorted({p.gpus for p in points if p.workload == "longmultiturn"})
    lines += [long_sizing(g) for g in long_gpus]
    stacks = list(dict.fromkeys(p.stack for p in points))
    for itl in dict.fromkeys((ITL_SLO_MS, TIGHT_ITL_SLO_MS)):
        lines.append(f"\ngoodput per GPU at TTFT p90 <= {TTFT_SLO_MS:.0f} ms and ITL p90 <= {itl:.0f} ms:")
        shapes = list(dict.fromkeys(p.model_shape for p in points))
        for w, shape in ((w, m) for w in WORKLOADS for m in shapes):
            mine = [p for p in points if p.workload == w and p.model_shape == shape]
            ran = [s for s in stacks if any(p.stack == s for p in mine)]
            if not ran:
                continue
            cells = {s: goodput(mine, s, w, itl) for s in ran}  # a stack without points: "-", not 0
            shown = {s: f"{cells[s]:7.0f}" if s in cells else f"{'-':>7}" for s in stacks}
            line = f"  {w:13} {shape:3} " + "  ".join(f"{s} {v}" for s, v in shown.items())
            for ours, theirs in PAIRS:
                if cells.get(theirs) and ours in cells:
                    line += f"  {ours}/{theirs} {cells[ours] / cells[theirs]:.2f}"
            lines.append(line)
    return "\n".join(lines)


def plot(points: list[Point], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        ex.log("matplotlib is not installed: no plot")
        return
    fig, axes = plt.subplots(2, len(WORKLOADS), figsize=(5 * len(WORKLOADS), 8), squeeze=False)
    for col, w in enumerate(WORKLOADS):
        for row, (attr, slos, label) in enumerate(
            (
                ("itl_p90", (ITL_SLO_MS, TIGHT_ITL_SLO_MS), "ITL p90 (ms)"),
                ("ttft_p90", (TTFT_SLO_MS,), "TTFT p90 (ms)"),
            )
        ):
            ax = axes[row][col]
            for stack, shape in dict.fromkeys((p.stack, p.model_shape) for p in points):
                mine = [p for p in points if (p.stack, p.model_shape, p.workload) == (stack, shape, w)]
                ax.plot([getattr(p, attr) for p in mine], [p.out_tok_s_per_gpu for p in mine], marker="o",
                        label=f"{stack} {shape}")  # fmt: skip
            for slo in dict.fromkeys(slos):
                ax.axvline(slo, linestyle="--", color="grey")
            ax.set(title=w, xlabel=label, ylabel="output tokens/s per GPU")
            ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def write_report(folder: Path) -> None:
    """The table, goodput and plot over every ``peers-*.json`` in ``folder`` (this call's and earlier
    ones'), into ``$OUT``."""
    measured = [
        Point(**row) for f in sorted(folder.glob("peers-*.json")) for row in json.loads(f.read_text())
    ]  # points of earlier versions have no cached_share_host: None
    measured = [p for p in measured if p.workload != "-"]
    (OUT / "peers.json").write_text(json.dumps([asdict(p) for p in measured], indent=1))
    plot(measured, OUT / "peers.png")
    text = report(measured)
    (OUT / "peers.txt").write_text(text + "\n")
    print(text)


def role_flags(role: str, share: float = 1.0) -> list[str]:
    """SGLang flags this run adds to an engine of ``role`` (``agg``, ``prefill`` or ``decode``), the same
    in both stacks: longmultiturn's cut KV cache, then HiCache's flags."""
    return [*pool_flags(role), *hicache_flags(role, share)]


def pool_flags(role: str) -> list[str]:
    """longmultiturn's cut KV cache (``--max-total-tokens``) for the engines that keep a prefix cache:
    aggregated and prefill engines. A disaggregated decode engine keeps none, so cutting its pool only
    bounds how many requests it decodes at once (the 2P2D sitting of 28 November was bound there from
    c32 in both stacks), which is not what the workload measures: it keeps its whole memory."""
    cut = "longmultiturn" in WORKLOADS and role != "decode"
    return ["--max-total-tokens", str(LONG_POOL_TOKENS)] if cut else []


def hicache_flags(role: str, share: float = 1.0) -> list[str]:
    """HiCache's flags for an engine of ``role`` (both stacks alike): aggregated and prefill engines only.
    A decode engine keeps no prefix cache in disaggregated serving (SGLang's default), and SGLang refuses
    HiCache there without ``--disaggregation-decode-enable-radix-cache``. ``share`` (a prefill engine's):
    how many GPUs' worth of host memory it holds, N / P, so that a disaggregated layout's host
    tier is as large as the aggregated one's (with half of it, 2P2D longmultiturn's conversations came
    back in a cycle longer than the prefill engines' caches, and LRU found none of them again)."""
    if not HICACHE or role == "decode":
        return []
    size = hicache_size_flags(share if role == "prefill" else 1.0)
    return ["--enable-hierarchical-cache", *size, "--hicache-write-policy", "write_through"]


def hicache_size_flags(share: float) -> list[str]:
    """How much host memory HiCache takes per engine, for ``share`` GPUs' worth. With longmultiturn's
    cut KV cache, ``HICACHE_RATIO`` times it; else the GPUs' whole KV cache would make that ratio more
    host memory than the machine has (4 x ~100 GB per H200 engine: 4 engines were OOM-killed at start),
    so a share of the machine's memory instead: ``--hicache-size`` of half of it split over the GPUs
    (``HICACHE_SIZE_GB`` per GPU sets it)."""
    if os.environ.get("HICACHE_SIZE_GB"):
        return ["--hicache-size", str(int(float(os.environ["HICACHE_SIZE_GB"]) * share))]
    if "longmultiturn" in WORKLOADS:
        return ["--hicache-ratio", f"{float(HICACHE_RATIO) * share:g}"]
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    kib = int(next(line for line in meminfo if line.startswith("MemTotal:")).split()[1])
    return ["--hicache-size", str(max(int(kib / 2**20 / 2 / len(ex.gpu_list()) * share), 1))]


def save_points(stack: str, points: list[Point]) -> None:
    """A stack's points so far, where the report of this call and of later ones finds them (one file
    per stack and model shape: a call of the other shape keeps them)."""
    text = json.dumps([asdict(p) for p in points], indent=1)
    name = f"peers-{stack}.json" if MODEL_SHAPE == "8b" else f"peers-{stack}-{MODEL_SHAPE}.json"
    for folder in (STATE, OUT):
        (folder / name).write_text(text)


def main(argv: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    if argv[:1] == ["report"]:  # python3 tests/gpu/run_peers.py report DIR: the report again, here
        write_report(Path(argv[1]) if len(argv) > 1 else STATE)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    stacks = argv or list(STACKS)
    if ex.ENGINE != "sglang" and "smg-pd" in stacks:  # the mocker serves SGLang's HTTP API, not its PD
        ex.log("smg-pd: skipped on the mocker (SGLang's PD bootstrap protocol is not simulated over HTTP)")
        stacks = [s for s in stacks if s != "smg-pd"]
    if HOST_WEIGHT:  # GPU-only routing (0) or another weight: its points apart from the default's
        stacks = [f"{s}-hw{HOST_WEIGHT}" if s.startswith("ours") else s for s in stacks]
    if MODEL_SHAPE not in MODEL_SHAPES:
        ex.log(f"MODEL_SHAPE={MODEL_SHAPE!r} is not one of {', '.join(MODEL_SHAPES)}; set one of those")
        return 2
    # every run (the mocker's too): rag's context on both stacks' engines, in the model shape asked
    ex.make_long_model(CONTEXT, MODEL_SHAPES[MODEL_SHAPE])
    gpus = ex.gpu_list()
    prefill = int(os.environ.get("SPLIT") or max(1, len(gpus) // 2))
    if "longmultiturn" in WORKLOADS:
        ex.log(long_sizing(len(gpus)))
    points: list[Point] = []
    STATE.mkdir(parents=True, exist_ok=True)  # one call per pair of stacks: the report takes them all
    for stack in stacks:
        try:
            mine = run_stack(stack, gpus, prefill)
        except Exception as e:  # one stack failing to start is reported; the others still run
            ex.log(f"{stack}: FAILED {type(e).__name__}: {e}")
            mine = [Point(stack, "-", 0, len(gpus), notes=[f"{type(e).__name__}: {e}"[:500]],
                          model_shape=MODEL_SHAPE)]  # fmt: skip
        points += mine
        save_points(stack, mine)
    write_report(STATE)
    failed = [p for p in points if p.workload == "-"]
    return 1 if failed or not points else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
