"""Engine death on GPUs, through the path users take: ``dynamo-run`` of the examples (``run_examples.py``'s
``Graph`` and ``user_manifest``), the official ``openai`` client, and a SIGKILL of an SGLang scheduler
process under load, as an OOM kill or a CUDA error ends it.

usage:
  python3 tests/gpu/run_chaos.py [CASE ...]          default: every case that fits the GPUs
  cases:
    agg-router        examples/agg-router.yaml (2 workers): STREAMS concurrent streams, SIGKILL of one
                      worker's scheduler at t = KILL_AT_S
    disagg            examples/disagg.yaml (1P + 1D): the same for the decode engine; then, once the graph
                      is back at full capacity, the prefill engine killed mid-transfer (requests arriving
                      until the kill, with longer prompts, so that some are in their prefill or KV transfer)
    agg-tp2           tests/gpu/examples/agg-tp2.yaml (a 2-rank engine, 1 GPU each): SIGKILL of rank 1's
                      scheduler
    restart-vs-exit   examples/agg.yaml twice, --on-engine-death restart and exit: the time from the SIGKILL
                      of the scheduler until the worker answers again
GRAPH_GPUS (e.g. 0,1) limits the GPUs a run takes. Every graph runs with ``dynamo-run --restart always``
(as Kubernetes restarts a container, and the operator a multinode group).

Per fault, each stream's outcome, against a greedy reference (temperature 0, ``ignore_eos``, the same
prompts and arrivals run just before the fault, on the same graph):
- ``exact``: complete (``OSL`` tokens, finish ``length``) and the same text as the reference: a migrated
  stream's continuation repeats no token and skips none;
- ``diverged``: complete, with another text (``cut`` says how far it had got at the kill);
- ``errored``: ended with an error event, within ``STALL_BOUND_S`` of the kill;
- ``lost``: anything else: an incomplete stream with no error, or an error later than the bound.
A fault passes with 0 lost and 0 diverged. Also reported: the frontend's migrations, the longest pause a
stream saw after the kill (a continuation whose role has no other worker waits for the restarted one,
up to the frontend's ``--scale-up-timeout-s``), and the time from the kill until full capacity (every
worker registered and answering ``/health``, the killed engine replaced by a new process). On SGLang
the workers run with ``--enable-deterministic-inference`` (batch invariant kernels), so that a greedy
answer does not depend on its batch: ``CHAOS_DETERMINISTIC=0`` leaves it out (``diverged`` then also
counts numerics).

``ENGINE=mocker`` runs the same script without a GPU (the suite runs it, small sizes); the mocker's
tokens depend only on the sequence before them, like a greedy model's. Everything lands in ``$OUT``
(``chaos.json``, ``chaos.txt``, the logs); the summary is printed last; exit 1 when a fault failed.

Env: CHAOS_STREAMS (32), CHAOS_ISL (512 words), CHAOS_PREFILL_ISL (4096), CHAOS_OSL (256), CHAOS_KILL_AT_S
(5), CHAOS_STALL_BOUND_S (60 on SGLang, 10 on the mocker), CHAOS_RECOVERY_S (600, 60), CHAOS_DETERMINISTIC.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_examples import (  # the helpers of the user-path script, beside this one
    ENGINE,
    MODEL_DIR,
    OUT,
    Graph,
    cmdline,
    descendants,
    frontend_metric,
    gpu_list,
    log,
    user_manifest,
)

SGLANG = ENGINE == "sglang"
STREAMS = int(os.environ.get("CHAOS_STREAMS", 32))
ISL = int(os.environ.get("CHAOS_ISL", 512))
PREFILL_ISL = int(os.environ.get("CHAOS_PREFILL_ISL", 4096))
OSL = int(os.environ.get("CHAOS_OSL", 256))
KILL_AT_S = float(os.environ.get("CHAOS_KILL_AT_S", 5))
STALL_BOUND_S = float(os.environ.get("CHAOS_STALL_BOUND_S", 60 if SGLANG else 10))
RECOVERY_S = float(os.environ.get("CHAOS_RECOVERY_S", 600 if SGLANG else 60))
DETERMINISTIC = os.environ.get("CHAOS_DETERMINISTIC", "1") == "1"
WORKER_ARGS = ["--enable-deterministic-inference"] if SGLANG and DETERMINISTIC else []
ENGINE_TITLES = ("sglang::scheduler", "mocker-scheduler")  # SGLang's schedulers; the mocker's stand-in
WORKER_MODULES = (" -m dynamo_worker.sglang", " -m dynamo_worker.mocker", " -m dynamo.sglang")


# --- the graph's processes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerProc:
    pid: int
    pod: str
    role: str  # agg | prefill | decode
    rank: int  # node rank of a multinode engine (0 otherwise)
    system_port: int | None


def _environ(pid: int) -> dict[str, str]:
    with contextlib.suppress(OSError):
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
    return {}


def workers(graph: Graph) -> list[WorkerProc]:
    """The graph's worker processes (every rank), by pod name."""
    found = []
    for pid in descendants(graph.proc.pid):
        line = cmdline(pid)
        if not any(m in f" {line}" for m in WORKER_MODULES) or "--role" in line:
            continue
        env = _environ(pid)
        mode = re.search(r"--disaggregation-mode[= ](\w+)", line)
        rank = re.search(r"--node-rank[= ](\d+)", line)
        port = env.get("DYN_SYSTEM_PORT") or (re.search(r"--system-port[= ](\d+)", line) or [None, None])[1]
        role = {"prefill": "prefill", "decode": "decode"}.get(mode[1] if mode else "", "agg")
        found.append(
            WorkerProc(
                pid, env.get("POD_NAME", str(pid)), role, int(rank[1]) if rank else 0, port and int(port)
            )
        )
    return sorted(found, key=lambda w: w.pod)


def engine_pids(worker: WorkerProc) -> list[int]:
    """The engine's scheduler processes under a worker process."""
    return [
        p for p in descendants(worker.pid) if p != worker.pid and any(t in cmdline(p) for t in ENGINE_TITLES)
    ]


def healthy(worker: WorkerProc) -> bool:
    if worker.system_port is None or worker.rank > 0:
        return True  # a non-leader rank serves no /health: the leader speaks for the group
    with contextlib.suppress(OSError):
        url = f"http://127.0.0.1:{worker.system_port}/health"
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    return False


def frontend_workers(graph: Graph) -> int:
    from dynamo_worker.local.supervisor import workers_seen

    with (
        contextlib.suppress(OSError),
        urllib.request.urlopen(f"http://127.0.0.1:{graph.port}/metrics", timeout=5) as r,
    ):
        return workers_seen(r.read().decode(errors="replace")) or 0
    return 0


def full_capacity_after(
    graph: Graph, pod: str, killed: set[int], capacity: int, since: float
) -> float | None:
    """Seconds from ``since`` until the frontend sees ``capacity`` workers again, every worker answers
    ``/health`` and the pod ``pod`` runs an engine process that was not killed; None past the bound."""
    while time.monotonic() - since < RECOVERY_S:
        procs = workers(graph)
        target = [w for w in procs if w.pod == pod]
        fresh = [p for w in target for p in engine_pids(w) if p not in killed]
        if fresh and frontend_workers(graph) >= capacity and all(healthy(w) for w in procs):
            return time.monotonic() - since
        time.sleep(0.5)
    return None


# --- streams -----------------------------------------------------------------------------------------------


@dataclass
class Stream:
    sent_s: float = 0.0  # after the run started
    text: str = ""
    tokens: int = 0
    finish: str | None = None
    error: str | None = None
    cut: int | None = None  # characters it had received when the engine was killed
    stall_s: float = 0.0  # the longest wait for its next event after the kill


def prompt_texts(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(100, 30000)}" for _ in range(words)) for _ in range(n)]


async def one_stream(client, model: str, prompt: str, out: Stream, killed: list[float]) -> None:
    last: float | None = None
    try:
        events = await client.completions.create(
            model=model, prompt=prompt, max_tokens=OSL, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        async for event in events:
            if killed:
                now = time.monotonic()
                out.stall_s = max(out.stall_s, now - max(killed[0], last or 0.0))
                last = now
            if event.usage is not None:
                out.tokens = event.usage.completion_tokens
            for choice in event.choices:
                out.finish = choice.finish_reason or out.finish
                out.text += choice.text or ""
    except Exception as e:  # the client's errors (an error event, a timeout): recorded, judged below
        out.error = f"{type(e).__name__}: {str(e)[:300]}"
        if killed:
            out.stall_s = max(out.stall_s, time.monotonic() - max(killed[0], last or 0.0))


async def run_streams(
    graph: Graph, prompts: list[str], spread_s: float, kill=None
) -> tuple[list[Stream], float | None]:
    """Every prompt streamed, the i-th sent at ``i * spread_s / len(prompts)``; ``kill()`` at
    ``KILL_AT_S`` (returns the pids it killed). Returns the streams and when the kill happened."""
    import openai

    client = openai.AsyncOpenAI(base_url=graph.base, api_key="none", max_retries=0, timeout=STALL_BOUND_S * 4)
    streams = [Stream() for _ in prompts]
    killed: list[float] = []
    started = time.monotonic()

    async def send(i: int) -> None:
        await asyncio.sleep(i * spread_s / len(prompts))
        streams[i].sent_s = time.monotonic() - started
        await one_stream(client, graph.model, prompts[i], streams[i], killed)

    async def killer() -> None:
        await asyncio.sleep(KILL_AT_S)
        for s in streams:
            s.cut = len(s.text)
        await asyncio.to_thread(kill)
        killed.append(time.monotonic())

    tasks = [asyncio.create_task(send(i)) for i in range(len(prompts))]
    killing = asyncio.create_task(killer()) if kill is not None else None
    try:
        await asyncio.gather(*tasks)
        if killing is not None:
            await killing
    finally:
        await client.close()
    return streams, (killed[0] if killed else None)


# --- one fault ---------------------------------------------------------------------------------------------


@dataclass
class Fault:
    name: str
    select: str  # which engine: "agg", "decode", "prefill", "rank1"
    spread_s: float = 0.0  # arrivals spread over this long (0: all at once)
    isl: int = ISL


@dataclass
class FaultResult:
    name: str
    streams: int
    exact: int = 0
    diverged: int = 0
    errored: int = 0
    lost: int = 0
    in_prefill_at_kill: int = 0  # sent before the kill, nothing received yet
    migrations: float = 0.0
    max_stall_s: float = 0.0
    full_capacity_s: float | None = None
    killed: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.lost == 0 and self.diverged == 0 and self.full_capacity_s is not None


def target_of(graph: Graph, select: str) -> WorkerProc:
    procs = workers(graph)
    chosen = [w for w in procs if (w.rank == 1 if select == "rank1" else w.role == select and w.rank == 0)]
    if not chosen:
        raise RuntimeError(f"no {select} worker under dynamo-run: {procs}")
    return chosen[0]


def judge(result: FaultResult, streams: list[Stream], refs: list[Stream], killed_at: float | None) -> None:
    for s, ref in zip(streams, refs, strict=True):
        complete = s.error is None and s.finish == "length" and s.tokens == OSL
        result.max_stall_s = max(result.max_stall_s, s.stall_s)
        if s.cut == 0 and killed_at is not None and s.sent_s < KILL_AT_S:
            result.in_prefill_at_kill += 1
        if complete:
            if s.text == ref.text:
                result.exact += 1
            else:
                result.diverged += 1
                first = next(
                    (i for i, (a, b) in enumerate(zip(s.text, ref.text, strict=False)) if a != b), None
                )
                result.notes.append(f"diverged at char {first} (cut at {s.cut})")
        elif s.error is not None and s.stall_s <= STALL_BOUND_S:
            result.errored += 1
            result.notes.append(f"error {s.stall_s:.1f}s after the kill: {s.error[:160]}")
        else:
            result.lost += 1
            result.notes.append(f"lost: {s.error or s.finish} tokens={s.tokens} stall={s.stall_s:.1f}s")


def run_fault(graph: Graph, fault: Fault, seed: int) -> FaultResult:
    prompts = prompt_texts(STREAMS, fault.isl, seed)
    result = FaultResult(fault.name, len(prompts))
    capacity = frontend_workers(graph)
    refs, _ = asyncio.run(run_streams(graph, prompts, fault.spread_s))
    bad_refs = [r.error or r.finish for r in refs if r.error is not None or r.tokens != OSL]
    if bad_refs:
        result.notes.append(f"the reference run itself failed: {bad_refs[:3]}")
        result.lost = len(bad_refs)
        return result
    target = target_of(graph, fault.select)
    migrations_before = frontend_metric(graph, "dynamo_frontend_migrations_total")

    def kill() -> list[int]:
        pids = engine_pids(target)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        result.killed = pids
        log(f"{fault.name}: SIGKILLed {target.pod}'s engine processes {pids}")
        return pids

    streams, killed_at = asyncio.run(run_streams(graph, prompts, fault.spread_s, kill))
    if killed_at is None or not result.killed:
        result.notes.append("no engine process was killed")
        result.lost = len(streams)
        return result
    judge(result, streams, refs, killed_at)
    result.migrations = frontend_metric(graph, "dynamo_frontend_migrations_total") - migrations_before
    result.full_capacity_s = full_capacity_after(graph, target.pod, set(result.killed), capacity, killed_at)
    log(f"{fault.name}: {asdict(result)}")
    return result


GRAPHS: dict[str, tuple[str, int, list[Fault]]] = {
    "agg-router": ("examples/agg-router.yaml", 2, [Fault("agg-router: one worker's scheduler", "agg")]),
    "disagg": (
        "examples/disagg.yaml",
        2,
        [
            Fault("disagg: the decode engine", "decode"),
            Fault("disagg: the prefill engine mid-transfer", "prefill", spread_s=KILL_AT_S, isl=PREFILL_ISL),
        ],
    ),
    "agg-tp2": ("tests/gpu/examples/agg-tp2.yaml", 2, [Fault("agg-tp2: rank 1's scheduler", "rank1")]),
}


def run_graph(name: str, gpus: str) -> list[FaultResult]:
    example, _, faults = GRAPHS[name]
    manifest = user_manifest(example, OUT / "manifests" / name, worker_args=WORKER_ARGS)
    graph = Graph(f"chaos-{name}", manifest, gpus, run_args=("--restart", "always"))
    results = []
    try:
        for i, fault in enumerate(faults):
            results.append(run_fault(graph, fault, seed=7 + i))
    finally:
        rc, left = graph.stop()
        if rc != 0 or left:
            for r in results:
                r.notes.append(f"dynamo-run exit {rc}, {len(left)} processes left")
    return results


# --- restart in place against exit ------------------------------------------------------------------------


def serves_again_after(graph: Graph, since: float) -> float | None:
    """Seconds from ``since`` until a short completion is answered again; None past the bound."""
    import openai

    client = openai.OpenAI(base_url=graph.base, api_key="none", max_retries=0, timeout=10)
    while time.monotonic() - since < RECOVERY_S:
        with contextlib.suppress(Exception):
            r = client.completions.create(model=graph.model, prompt="w5 w6 w7", max_tokens=4)
            if r.choices and r.choices[0].finish_reason:
                return time.monotonic() - since
        time.sleep(0.5)
    return None


def restart_vs_exit(gpus: str) -> list[dict]:
    rows = []
    for mode in ("restart", "exit"):
        manifest = user_manifest(
            "examples/agg.yaml",
            OUT / "manifests" / f"agg-{mode}",
            worker_args=[*WORKER_ARGS, "--on-engine-death", mode],
        )
        graph = Graph(f"chaos-agg-{mode}", manifest, gpus, run_args=("--restart", "always"))
        row: dict = {"mode": mode, "ready_s": round(graph.ready_s, 1)}
        try:
            since = time.monotonic()
            row["warm_s"] = serves_again_after(graph, since)
            (target,) = [w for w in workers(graph) if w.role == "agg"]
            pids = engine_pids(target)
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            again = serves_again_after(graph, killed)
            row.update(killed=pids, serves_again_s=again and round(again, 2))
            row["worker_restarted"] = target.pid not in [w.pid for w in workers(graph)]
            row["ok"] = again is not None and row["worker_restarted"] == (mode == "exit")
        finally:
            row["exit_code"], left = graph.stop()
            row["left"] = len(left)
        log(f"restart-vs-exit: {row}")
        rows.append(row)
    return rows


# --- main --------------------------------------------------------------------------------------------------


def summary(results: list[FaultResult], modes: list[dict]) -> str:
    lines = [
        f"{'fault':42} {'streams':>7} {'exact':>5} {'diverged':>8} {'errored':>7} {'lost':>4} "
        f"{'in prefill':>10} {'migrated':>8} {'max stall s':>11} {'full capacity s':>15}"
    ]
    for r in results:
        cap = f"{r.full_capacity_s:.1f}" if r.full_capacity_s is not None else "never"
        lines.append(
            f"{r.name:42} {r.streams:7d} {r.exact:5d} {r.diverged:8d} {r.errored:7d} {r.lost:4d} "
            f"{r.in_prefill_at_kill:10d} {r.migrations:8.0f} {r.max_stall_s:11.2f} {cap:>15}"
            + ("" if r.passed else "  FAIL")
        )
    for m in modes:
        lines.append(
            f"--on-engine-death {m['mode']:8} serves again {m.get('serves_again_s')} s after the SIGKILL "
            f"(worker process restarted: {m.get('worker_restarted')}; ready {m.get('ready_s')} s)"
            + ("" if m.get("ok") else "  FAIL")
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the graphs through the finally blocks
    if SGLANG:
        from run_gpu import make_model

        make_model(MODEL_DIR)
    gpus = gpu_list()
    cases = argv or [*GRAPHS, "restart-vs-exit"]
    results: list[FaultResult] = []
    modes: list[dict] = []
    for case in cases:
        if case == "restart-vs-exit":
            modes = restart_vs_exit(gpus[0])
            continue
        need = GRAPHS[case][1]
        if need > len(gpus):
            log(f"{case}: needs {need} GPUs, {len(gpus)} here; skipped")
            continue
        results += run_graph(case, ",".join(gpus[:need]))
    (OUT / "chaos.json").write_text(
        json.dumps({"faults": [asdict(r) for r in results], "restart_vs_exit": modes}, indent=1)
    )
    text = summary(results, modes)
    (OUT / "chaos.txt").write_text(text + "\n")
    print(text)
    ok = all(r.passed for r in results) and all(m.get("ok") and m.get("exit_code") == 0 for m in modes)
    return 0 if ok and (results or modes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
