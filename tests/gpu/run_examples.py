"""The path users take, on real GPUs: each example served by ``dynamo-run`` (the pods ``render()``
produces, run as processes), driven by the official ``openai`` client.

usage:
  python3 tests/gpu/run_examples.py examples [NAME ...]   every example below (or the named ones)
  python3 tests/gpu/run_examples.py fresh N [NAME]        N fresh starts of NAME (default disagg):
                                                          does its very first request answer, and
                                                          how fast against the steady state?
  python3 tests/gpu/run_examples.py stuck                 disagg, its prefill engine stopped (SIGSTOP)
                                                          mid-request: the client's answer comes within
                                                          the frontend's --kv-transfer-timeout-s
GRAPH_GPUS (e.g. 2,3) limits the GPUs a run takes, so two runs can share a machine.

What changes against the committed manifest is only what a user of this GPU machine changes:
``--model-dir`` (the 8B-shaped dummy model of ``tests/gpu/model``, with a tokenizer whose token *i* is
``w<i>``) and the SGLang flags that load dummy weights and avoid the kernels the carried Hopper slice
leaves out (``USER_FLAGS``). Nothing else: dynamo-run picks the ports, gives each pod its GPUs as
``CUDA_VISIBLE_DEVICES`` (so each engine sees only its own GPUs, as on Kubernetes) and starts the
processes the operator would.

Per example (``examples``): time to Ready; the first request is a chat (a short one, sent at once,
as a user does), bounded by ``FIRST_S``; then a streamed chat, usage counts, a completion, a
concurrent batch of ``NREQ`` x ``ISL``/``OSL`` (out tok/s, TTFT p50, ITL p50); extra checks per example
(KV events relayed, the planner reading metrics, an image chat); finally Ctrl-C (SIGINT): dynamo-run
must exit 0 and leave no process of its tree behind.

``fresh``: N times, a fresh dynamo-run of the example whose first request (a chat, then a completion
on odd starts: both orders), streamed and sent the moment dynamo-run says Ready, must answer within
``FIRST_S``, its time to first token within ``FIRST_RATIO`` (2) times the graph's steady state (the
median TTFT of ``STEADY_N`` (5) more such requests after it), and the frontend must not have held it
(``held ms``: its wait in the admission queue, from ``/metrics``): a new prefill/decode pair must have
opened its KV transfer connection and the frontend must have loaded the model card before Ready, not on
the user's first request. A first request that has not answered after ``STALL_S`` gets every process of
the tree's Python stacks dumped (``py-spy dump``, when it is installed) into ``$OUT/stacks-*.txt``,
which is how a wedge is explained rather than only counted.

``ENGINE=mocker`` runs the same script without a GPU or SGLang (the suite does, small sizes).
Everything printed and every log lands in ``$OUT``; the summary is printed last and the exit status is
1 when a check failed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = Path(os.environ.get("OUT") or "/tmp/dynamo-gpu-out")
ENGINE = os.environ.get("ENGINE", "sglang")
STARTUP_S = float(os.environ.get("STARTUP_S", 600))
FIRST_S = float(os.environ.get("FIRST_S", 60))  # the first request's bound
STALL_S = float(os.environ.get("STALL_S", 15))  # ... after which the stacks are dumped
STEADY_N = int(os.environ.get("STEADY_N", 5))  # fresh starts: requests after the first, for steady-state TTFT
FIRST_RATIO = float(
    os.environ.get("FIRST_RATIO", 2)
)  # ... the first request's TTFT may be this many times it
ISL, OSL, NREQ = (int(os.environ.get(k, d)) for k, d in (("ISL", 2048), ("OSL", 64), ("NREQ", 32)))
GRAPHS = os.environ.get("GRAPHS", "1") == "1"
COLD = os.environ.get("COLD", "1") == "1"  # fresh starts get empty compile caches, as a new pod does
MODEL_DIR = Path(os.environ.get("MODEL_DIR") or "/tmp/dynamo-gpu-model")
# What a user on this machine adds to each SGLang worker: dummy weights, and kernels the carried slice has.
USER_FLAGS = [
    "--load-format", "dummy", "--random-seed", "1", "--attention-backend", "triton",
    "--sampling-backend", "pytorch", "--grammar-backend", "none", "--cuda-graph-backend-prefill", "disabled",
    "--mm-feature-transport", "cpu", "--context-length", "8192",
]  # fmt: skip
if not GRAPHS:
    USER_FLAGS += ["--cuda-graph-backend-decode", "disabled"]
EXTRA_FLAGS = os.environ.get("EXTRA_FLAGS", "").split()
FRONTEND_ARGS = os.environ.get("FRONTEND_ARGS", "").split()  # added to the frontend's args (fresh, run_peers)

# name -> (manifest under the checkout, GPUs it needs, extra checks)
EXAMPLES: dict[str, tuple[str, int, tuple[str, ...]]] = {
    "agg": ("examples/agg.yaml", 1, ()),
    "agg-router": ("examples/agg-router.yaml", 2, ("kv_events",)),
    "agg-hicache": ("examples/agg-hicache.yaml", 2, ("kv_events",)),
    "disagg": ("examples/disagg.yaml", 2, ()),
    "disagg-router": ("examples/disagg-router.yaml", 4, ("kv_events",)),
    "disagg-tp2": ("tests/gpu/examples/disagg-tp2.yaml", 4, ()),
    "agg-tp2": ("tests/gpu/examples/agg-tp2.yaml", 2, ()),
    "planner": ("examples/disagg-planner.yaml", 2, ("planner",)),
    "dynamo-agg": ("tests/fixtures/dynamo-sglang-deploy/v1beta1/agg.yaml", 1, ()),
    "dynamo-agg-router": ("tests/fixtures/dynamo-sglang-deploy/v1beta1/agg_router.yaml", 2, ()),
    "dynamo-disagg": ("tests/fixtures/dynamo-sglang-deploy/v1beta1/disagg.yaml", 2, ()),
}
SGLANG_MODULES = ("dynamo_worker.sglang", "dynamo.sglang")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    """A port for a process that must be told it before it binds it: below the ephemeral range, where no
    other process's port-0 bind or outgoing connection takes it first (dynamo-run picks its pods' ports
    the same way)."""
    from dynamo_worker.runtime.nats_server import free_port as below_ephemeral

    return below_ephemeral()


# --- the manifest as a user of this machine edits it -------------------------------------------------


def _containers(graph: dict) -> list[dict]:
    """Every main container of the graph, in either API version."""
    spec = graph.get("spec") or {}
    found = []
    for svc in (spec.get("services") or {}).values():  # v1alpha1
        main = ((svc or {}).get("extraPodSpec") or {}).get("mainContainer")
        if main:
            found.append(main)
    for comp in spec.get("components") or []:  # v1beta1
        containers = (((comp or {}).get("podTemplate") or {}).get("spec") or {}).get("containers") or []
        found += [c for c in containers if c.get("name") == "main"] or containers[:1]
    return found


def user_manifest(
    example: str,
    folder: Path,
    frontend_args: list[str] | None = None,
    worker_args: list[str] | None = None,
) -> Path:
    """``example`` with ``USER_FLAGS`` (then ``worker_args``) appended to every SGLang worker's args (and
    ``frontend_args`` to the frontend's), written into ``folder``."""
    graph = user_graph(yaml.safe_load((ROOT / example).read_text()), frontend_args, worker_args)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / Path(example).name
    path.write_text(yaml.safe_dump(graph, sort_keys=False))
    return path


def user_graph(
    graph: dict, frontend_args: list[str] | None = None, worker_args: list[str] | None = None
) -> dict:
    """The graph document with ``USER_FLAGS`` (then ``worker_args``) appended to every SGLang worker's
    args (and ``frontend_args`` to the frontend's), changed in place."""
    for svc in (graph["spec"].get("services") or {}).values():  # v1alpha1, as the examples are
        if frontend_args and svc.get("componentType") == "frontend":
            main = svc.setdefault("extraPodSpec", {}).setdefault("mainContainer", {})
            main["args"] = [*main.get("args", []), *frontend_args]
    for container in _containers(graph):
        words = (
            " ".join(map(str, container.get("command") or []))
            + " "
            + " ".join(map(str, container.get("args") or []))
        )
        if not any(m in words for m in SGLANG_MODULES) or "--role" in words:  # encode/diffusion roles
            continue
        args = container.get("args") or []
        if (
            len(args) >= 1 and isinstance(args[-1], str) and " -m " in f" {args[-1]}"
        ):  # sh -c "python3 -m ..."
            args[-1] = f"{args[-1]} {' '.join(USER_FLAGS + EXTRA_FLAGS + (worker_args or []))}"
        else:
            container["args"] = [*map(str, args), *USER_FLAGS, *EXTRA_FLAGS, *(worker_args or [])]
    return graph


# --- one dynamo-run --------------------------------------------------------------------------------


def descendants(root: int) -> list[int]:
    """Every process under ``root`` (and root), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""


def dump_stacks(root: int, tag: str) -> Path | None:
    """``py-spy dump`` of every Python process under ``root`` into ``$OUT/stacks-<tag>.txt``."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    site_spy = next((p for p in os.environ.get("PATH", "").split(":") if Path(p, "py-spy").exists()), None)
    spy = str(Path(site_spy, "py-spy")) if site_spy else spy
    if not Path(spy).exists():
        log("py-spy is not installed: no stacks")
        return None
    path = OUT / f"stacks-{tag}.txt"
    with path.open("w") as out:
        for pid in descendants(root):
            line = cmdline(pid)
            if "python" not in line:
                continue
            out.write(f"===== pid {pid}: {line[:300]}\n")
            out.flush()
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(
                    [spy, "dump", "--pid", str(pid)], stdout=out, stderr=subprocess.STDOUT, timeout=30
                )
    log(f"stacks of the tree in {path}")
    return path


def cold_caches(name: str) -> dict[str, str]:
    """The environment of what a new pod has: empty compile caches (Triton, FlashInfer and the rest
    under XDG's cache, TorchInductor, CUDA's), in a new folder named after ``name``."""
    caches = Path(tempfile.mkdtemp(prefix=f"caches-{name}-"))
    return {
        "TRITON_CACHE_DIR": str(caches / "triton"),
        "XDG_CACHE_HOME": str(caches / "xdg"),
        "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
        "CUDA_CACHE_PATH": str(caches / "nv"),
    }


class Graph:
    """``dynamo-run MANIFEST --engine $ENGINE --model-dir ... [run_args]`` until Ready (bounded)."""

    def __init__(
        self, name: str, manifest: Path, gpus: str, cold: bool = False, run_args: tuple[str, ...] = ()
    ) -> None:
        self.name = name
        self.port = free_port()
        self.logs = OUT / "logs" / name
        self.logs.mkdir(parents=True, exist_ok=True)
        self.log_path = self.logs / "dynamo-run.log"
        # python -m: the GPU machine runs the checkout, so there is no dynamo-run script beside python
        argv = [sys.executable, "-m", "dynamo_worker.local", str(manifest), "--engine", ENGINE,
                "--port", str(self.port), "--startup-timeout", str(STARTUP_S),
                "--log-dir", str(self.logs), *run_args]  # fmt: skip
        if ENGINE == "sglang":
            argv += ["--model-dir", str(MODEL_DIR)]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus}
        if cold:
            env.update(cold_caches(name))
        self._out = self.log_path.open("w")
        started = time.monotonic()
        self.proc = subprocess.Popen(
            argv, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        deadline = started + STARTUP_S + 30
        try:
            self._wait_ready(name, deadline)
        except BaseException:  # never leave a half-started graph holding GPUs (also on SIGTERM)
            self.stop()
            raise
        self.ready_s = time.monotonic() - started
        self.base = f"http://127.0.0.1:{self.port}/v1"
        self.model = re.search(r"models:\s+(\S+)", self.text())[1].rstrip(",")
        self.tree = descendants(self.proc.pid)
        log(f"{name}: Ready after {self.ready_s:.1f}s ({len(self.tree)} processes), model {self.model}")

    def _wait_ready(self, name: str, deadline: float) -> None:
        while "Serving namespace=" not in self.text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"dynamo-run {name} did not become Ready; see {self.log_path}:\n{self.tail()}"
                )
            time.sleep(0.2)

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.text().splitlines()[-n:])

    def system_ports(self) -> list[int]:
        """Every process's system port (``--system-port`` or ``DYN_SYSTEM_PORT``) as dynamo-run set it."""
        ports: set[int] = set()
        for pid in descendants(self.proc.pid):
            ports |= {int(p) for p in re.findall(r"--system-port (\d+)", cmdline(pid))}
            with contextlib.suppress(OSError):
                env = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
                ports |= {int(p) for p in re.findall(r"(?:^|\0)DYN_SYSTEM_PORT=(\d+)", env)}
        return sorted(ports)

    def metric(self, name: str) -> float:
        """The sum of ``name`` (all label sets) over every process's ``/metrics``."""
        total = 0.0
        for port in self.system_ports():
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r,
            ):
                total += sum(
                    float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", r.read().decode(), re.M)
                )
        return total

    def stop(self) -> tuple[int | None, list[int]]:
        """Ctrl-C, as a user stops it: its exit status and the processes of its tree still alive."""
        tree = set(getattr(self, "tree", [])) | set(descendants(self.proc.pid))
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                log(f"{self.name}: dynamo-run did not stop within 120s after Ctrl-C; killing its group")
        rc = self.proc.poll()
        time.sleep(0.5)
        left = [p for p in tree if Path(f"/proc/{p}").exists() and "zombie" not in _state(p)]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._out.close()
        return rc, left


def _state(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].split("\n", 1)[0].lower()
    return ""


# --- requests ----------------------------------------------------------------------------------------


class First(NamedTuple):
    seconds: float | None  # to the whole answer; None when there was none
    why: str  # "ok", or why not
    ttft_s: float | None = None  # to its first token (streamed)


_CLIENT_WARM: set[str] = set()


class _CannedStream(http.server.BaseHTTPRequestHandler):
    """Answers any POST with one streamed chunk of the endpoint's kind (``warm_client``)."""

    def log_message(self, *args: object) -> None:
        return None

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if "chat" in self.path:
            choice = {"index": 0, "delta": {"role": "assistant", "content": "w1"}, "finish_reason": None}
            chunk = {
                "id": "x",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "m",
                "choices": [choice],
            }
        else:
            choice = {"index": 0, "text": "w1", "finish_reason": None}
            chunk = {"id": "x", "object": "text_completion", "created": 1, "model": "m", "choices": [choice]}
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n")


def warm_client(kind: str) -> None:
    """The openai client's own first streamed call of a kind costs it a tenth of a second or more (lazy
    imports, building its response models): pay that against a canned local answer, so that a first
    request's time is the graph's."""
    if kind in _CLIENT_WARM:
        return
    _CLIENT_WARM.add(kind)
    server = http.server.HTTPServer(("127.0.0.1", 0), _CannedStream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        send_streamed_to(f"http://127.0.0.1:{server.server_address[1]}/v1", "m", kind, 10)
    finally:
        server.shutdown()
        server.server_close()


def send_streamed(graph: Graph, kind: str, timeout_s: float) -> float:
    """One short request (``chat`` or ``completion``), streamed: seconds to its first token."""
    warm_client(kind)
    return send_streamed_to(graph.base, graph.model, kind, timeout_s)


def send_streamed_to(base: str, model: str, kind: str, timeout_s: float) -> float:
    import openai

    client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=timeout_s)
    start = time.monotonic()
    if kind == "chat":
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hello!"}], max_tokens=8, stream=True
        )
    else:
        stream = client.completions.create(model=model, prompt="w5 w6 w7 w8", max_tokens=8, stream=True)
    first = None
    for chunk in stream:
        text = (
            (chunk.choices[0].delta.content if kind == "chat" else chunk.choices[0].text)
            if chunk.choices
            else ""
        )
        if first is None and text:
            first = time.monotonic() - start
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return first


def first_request(graph: Graph, kind: str, tag: str) -> First:
    """The graph's very first request (``chat`` or ``completion``, streamed): seconds to its answer and to
    its first token, or None and why. After ``STALL_S`` without an answer the tree's stacks are dumped."""
    warm_client(kind)
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(send_streamed, graph, kind, FIRST_S)
        try:
            future.result(timeout=STALL_S)
        except concurrent.futures.TimeoutError:
            log(f"{graph.name}: first {kind} has not answered after {STALL_S:.0f}s; dumping stacks")
            dump_stacks(graph.proc.pid, f"{tag}-a")
            with contextlib.suppress(concurrent.futures.TimeoutError, Exception):
                future.result(timeout=20)
            if not future.done():
                dump_stacks(graph.proc.pid, f"{tag}-b")
        except Exception:
            pass
        try:
            ttft = future.result(timeout=max(1.0, FIRST_S - (time.monotonic() - start)))
            return First(time.monotonic() - start, "ok", ttft)
        except Exception as e:
            return First(None, f"{type(e).__name__}: {str(e)[:200]}")


def steady_ttft(graph: Graph, kind: str, n: int = STEADY_N) -> float:
    """The median time to first token of ``n`` more requests like the first, one after the other."""
    return sorted(send_streamed(graph, kind, FIRST_S) for _ in range(n))[n // 2]


@dataclass
class Result:
    name: str
    gpus: str
    ready_s: float = 0.0
    first_s: float | None = None
    checks: dict[str, bool] = field(default_factory=dict)
    out_tok_s: float = 0.0
    ttft_p50_ms: float = 0.0
    itl_p50_ms: float = 0.0
    exit_code: int | None = None
    left_processes: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (
            self.first_s is not None
            and all(self.checks.values())
            and self.exit_code == 0
            and self.left_processes == 0
        )


def check_basics(graph: Graph, result: Result) -> None:
    """A streamed chat, usage, a completion, logprobs-free and bounded."""
    import openai

    client = openai.OpenAI(base_url=graph.base, api_key="none", max_retries=0, timeout=120)
    stream = client.chat.completions.create(
        model=graph.model, messages=[{"role": "user", "content": "w11 w12 w13"}], max_tokens=16,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    pieces, usage = 0, None
    for chunk in stream:
        pieces += bool(chunk.choices and chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    result.checks["chat_streams"] = pieces > 1
    result.checks["stream_usage"] = usage is not None and usage.completion_tokens == 16
    r = client.completions.create(
        model=graph.model, prompt=list(range(10, 310)), max_tokens=12, extra_body={"ignore_eos": True}
    )
    result.checks["completion_usage"] = (
        r.usage is not None and r.usage.prompt_tokens == 300 and r.usage.completion_tokens == 12
    )


def batch(graph: Graph, result: Result) -> None:
    """``NREQ`` streamed completions of ``ISL`` ids / ``OSL`` tokens at once: out tok/s, TTFT, ITL p50."""
    import random

    import openai

    client = openai.OpenAI(base_url=graph.base, api_key="none", max_retries=0, timeout=600)
    rng = random.Random(7)
    prompts = [" ".join(f"w{rng.randrange(100, 30000)}" for _ in range(ISL)) for _ in range(NREQ)]

    def one(prompt: str) -> tuple[float, list[float], int]:
        t0 = time.perf_counter()
        stamps, n = [], 0
        for ev in client.completions.create(
            model=graph.model, prompt=prompt, max_tokens=OSL, stream=True, extra_body={"ignore_eos": True},
            stream_options={"include_usage": True},
        ):  # fmt: skip
            if ev.choices and ev.choices[0].text:
                stamps.append(time.perf_counter())
            if ev.usage:
                n = ev.usage.completion_tokens
        return t0, stamps, n

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(NREQ) as pool:
        runs = list(pool.map(one, prompts))
    seconds = time.perf_counter() - start
    tokens = sum(n for _, _, n in runs)
    ttft = sorted(s[0] - t0 for t0, s, _ in runs if s)
    itl = sorted((s[-1] - s[0]) / (n - 1) for _, s, n in runs if n > 1 and len(s) > 1)
    result.checks["batch_complete"] = tokens == NREQ * OSL
    result.out_tok_s = tokens / seconds
    result.ttft_p50_ms = 1000 * ttft[len(ttft) // 2] if ttft else float("nan")
    result.itl_p50_ms = 1000 * itl[len(itl) // 2] if itl else float("nan")


def check_kv_events(graph: Graph, result: Result) -> None:
    """The workers relay SGLang's KV events: the frontend's KV index learns blocks (its counter)."""
    import openai

    client = openai.OpenAI(base_url=graph.base, api_key="none", max_retries=0, timeout=120)
    prefix = " ".join(f"w{i}" for i in range(1000, 1512))
    for i in range(4):
        client.completions.create(model=graph.model, prompt=f"{prefix} w{i + 2}", max_tokens=2)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and graph.metric("dynamo_worker_kv_events_total") <= 0:
        time.sleep(0.5)
    relayed = graph.metric("dynamo_worker_kv_events_total")
    result.checks["kv_events_relayed"] = relayed > 0
    result.notes.append(f"kv events relayed: {relayed:.0f}")


def check_planner(graph: Graph, result: Result) -> None:
    """The planner runs and reads real metrics (its observed request rate after load)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        seen = graph.metric("planner_observed_request_rate")
        if seen > 0:
            break
        time.sleep(2)
    result.checks["planner_observed_load"] = graph.metric("planner_observed_request_rate") > 0


CHECKS = {"kv_events": check_kv_events, "planner": check_planner}


def serve_example(name: str, gpus: str) -> Result:
    example, _, extra = EXAMPLES[name]
    result = Result(name, gpus)
    manifest = user_manifest(example, OUT / "manifests")
    try:
        graph = Graph(name, manifest, gpus)
    except RuntimeError as e:
        result.notes.append(str(e)[:2000])
        return result
    try:
        result.ready_s = graph.ready_s
        result.first_s, why, _ = first_request(graph, "chat", name)
        if result.first_s is None:
            result.notes.append(f"first chat: {why}")
        else:
            check_basics(graph, result)
            batch(graph, result)
            for check in extra:
                CHECKS[check](graph, result)
    except (
        Exception
    ) as e:  # a failed check is reported with the rest, never a traceback in place of the table
        result.checks["no_exception"] = False
        result.notes.append(f"{type(e).__name__}: {str(e)[:300]}")
    finally:
        result.exit_code, left = graph.stop()
        result.left_processes = len(left)
        if left:
            result.notes.append("left running: " + "; ".join(cmdline(p)[:120] for p in left))
    log(f"{name}: {'PASS' if result.passed else 'FAIL'} {asdict(result)}")
    return result


def fresh_starts(n: int, name: str, gpus: str) -> list[dict]:
    example = EXAMPLES[name][0]
    manifest = user_manifest(example, OUT / "manifests", frontend_args=FRONTEND_ARGS)
    starts = []
    for i in range(n):
        kind = "chat" if i % 2 == 0 else "completion"
        row = {"start": i + 1, "first": kind}
        try:
            graph = Graph(f"{name}-fresh{i + 1}", manifest, gpus, cold=COLD)
        except RuntimeError as e:
            row.update(ready_s=None, first_s=None, why=why_not_ready(str(e)))
            starts.append(row)
            continue
        try:
            first = first_request(graph, kind, f"{name}-fresh{i + 1}")
            row.update(ready_s=round(graph.ready_s, 1), first_s=first.seconds and round(first.seconds, 2))
            row.update(why=first.why, first_ttft_ms=first.ttft_s and round(1000 * first.ttft_s))
            if first.ttft_s is not None:
                row.update(first_held_ms=round(1000 * queue_wait_s(graph)))
                steady = steady_ttft(graph, kind)
                row.update(steady_ttft_ms=round(1000 * steady), ratio=round(first.ttft_s / steady, 2))
        finally:
            rc, left = graph.stop()
            row.update(exit_code=rc, left=len(left))
        log(f"fresh start {row}")
        starts.append(row)
    return starts


def frontend_metric(graph: Graph, name: str) -> float:
    """The sum of ``name`` over its label sets on the frontend's ``/metrics`` (0 when it has none)."""
    with (
        contextlib.suppress(OSError),
        urllib.request.urlopen(f"http://127.0.0.1:{graph.port}/metrics", timeout=5) as r,
    ):
        text = r.read().decode(errors="replace")
        return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))
    return 0.0


def queue_wait_s(graph: Graph) -> float:
    """Seconds the frontend has held the graph's requests in its admission queue so far (the sum of
    ``dynamo_frontend_queue_wait_seconds``): after the first request, that one's wait, which is none
    when Ready means the model can be served (no worker, model card or pair still to come)."""
    if frontend_metric(graph, "dynamo_frontend_queue_wait_seconds_count") < 1:
        raise RuntimeError("the frontend's /metrics counts no queue wait after a request")
    return frontend_metric(graph, "dynamo_frontend_queue_wait_seconds_sum")


def why_not_ready(message: str) -> str:
    """The line that says why a graph did not become Ready (its first error, else the last line)."""
    lines = message.splitlines()
    errors = [ln for ln in lines if re.search(r"ERROR|Error|error:|refus|in use|exited|Traceback", ln)]
    return (errors[0] if errors else lines[-1] if lines else message)[-300:]


STUCK_BOUND_S = float(os.environ.get("STUCK_BOUND_S", 10))


def worker_pid(graph: Graph, role: str) -> int:
    """The worker process of ``role`` (its SGLang scheduler is a child of it)."""
    for pid in descendants(graph.proc.pid):
        line = cmdline(pid)
        if f"--disaggregation-mode {role}" in line and " -m dynamo_worker." in line:
            return pid
    raise RuntimeError(f"no {role} worker process under dynamo-run")


def stuck_engine(name: str, gpus: str) -> dict:
    """The prefill engine stops (SIGSTOP of its SGLang scheduler; the mocker's worker process) while a
    request is in its prefill leg: the client must get 504 within the frontend's bound, the pair must
    serve again once the engine continues."""
    import openai

    example = EXAMPLES[name][0]
    args = ["--kv-transfer-timeout-s", str(STUCK_BOUND_S)]
    graph = Graph(f"{name}-stuck", user_manifest(example, OUT / "manifests", frontend_args=args), gpus)
    row: dict = {"example": name, "bound_s": STUCK_BOUND_S}
    try:
        row["first"] = first_request(graph, "chat", f"{name}-stuck")[1]
        prefill = worker_pid(graph, "prefill")
        # SGLang's scheduler processes (the mocker simulates in its worker process: stop that one)
        schedulers = [p for p in descendants(prefill) if "sglang::scheduler" in cmdline(p)]
        target = schedulers or [prefill]
        client = openai.OpenAI(base_url=graph.base, api_key="none", max_retries=0, timeout=STUCK_BOUND_S * 4)
        prompt = " ".join(f"w{i}" for i in range(100, 1600))  # ~1500 tokens here, ~6600 on the mocker
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            started = time.monotonic()
            future = pool.submit(client.completions.create, model=graph.model, prompt=prompt, max_tokens=16)
            for pid in target:
                os.kill(pid, signal.SIGSTOP)
            stopped = time.monotonic()
            try:
                future.result()
                row.update(outcome="answered", status=200)
            except openai.APIStatusError as e:
                row.update(outcome=e.message[:1000], status=e.status_code)
            except Exception as e:  # the client's own timeout: the bound did not hold
                row.update(outcome=f"{type(e).__name__}: {e}", status=None)
            row["answered_after_stop_s"] = round(time.monotonic() - stopped, 2)
            row["answered_after_send_s"] = round(time.monotonic() - started, 2)
        for pid in target:
            os.kill(pid, signal.SIGCONT)
        again, row["after"], _ = first_request(graph, "completion", f"{name}-after-stuck")
        row["served_again_s"] = again and round(again, 2)
        row["ok"] = (
            row["status"] in (200, 504)
            and row["answered_after_send_s"] <= STUCK_BOUND_S + 5
            and again is not None
        )
    finally:
        row["exit_code"], left = graph.stop()
        row["left"] = len(left)
    log(f"stuck engine: {row}")
    return row


def gpu_list() -> list[str]:
    if os.environ.get("GRAPH_GPUS"):
        return os.environ["GRAPH_GPUS"].split(",")
    if ENGINE != "sglang":
        return [str(i) for i in range(8)]
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True
    )
    return out.stdout.split()


def make_long_model(context: int, shape: dict | None = None) -> None:
    """The model folder (``MODEL_DIR``) with a context of ``context`` tokens, and the user's
    ``--context-length`` to match: the long prompts of ``run_peers`` and ``run_hicache``. ``shape``:
    config.json fields that replace ``tests/gpu/model``'s (``run_peers``' ``MODEL_SHAPE``)."""
    sys.path.insert(0, str(HERE))
    from run_gpu import make_model

    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    make_model(MODEL_DIR, {**json.loads((HERE / "model" / "config.json").read_text()), **(shape or {})})
    config = json.loads((MODEL_DIR / "config.json").read_text())
    config["max_position_embeddings"] = context
    (MODEL_DIR / "config.json").write_text(json.dumps(config, indent=1))
    USER_FLAGS[USER_FLAGS.index("--context-length") + 1] = str(context)


def main(argv: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    # `timeout` (or a Ctrl-C) stops the script through its finally blocks, which stop every graph
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if ENGINE == "sglang":
        sys.path.insert(0, str(HERE))
        from run_gpu import make_model

        make_model(MODEL_DIR)
    gpus = gpu_list()
    mode = argv[0] if argv else "examples"
    if mode == "fresh":
        n = int(argv[1]) if len(argv) > 1 else 20
        name = argv[2] if len(argv) > 2 else "disagg"
        need = EXAMPLES[name][1]
        rows = fresh_starts(n, name, ",".join(gpus[:need]))
        (OUT / f"fresh-{name}.json").write_text(json.dumps(rows, indent=1))
        answered = sum(r.get("first_s") is not None for r in rows)
        clean = sum(r.get("exit_code") == 0 and r.get("left") == 0 for r in rows)
        quick = sum(r.get("ratio") is not None and r["ratio"] <= FIRST_RATIO for r in rows)
        held = sum(bool(r.get("first_held_ms")) for r in rows)
        lines = [
            f"{'start':>5} {'first':10} {'ready s':>8} {'first s':>8} {'TTFT ms':>8} {'held ms':>7} "
            f"{'steady ms':>9} {'ratio':>5} {'exit':>4} {'left':>4}  why"
        ]
        lines += [
            f"{r['start']:5d} {r['first']:10} {r.get('ready_s') or '-':>8} {r.get('first_s') or '-':>8} "
            f"{r.get('first_ttft_ms') or '-':>8} {r.get('first_held_ms', '-')!s:>7} "
            f"{r.get('steady_ttft_ms') or '-':>9} "
            f"{r.get('ratio') or '-':>5} "
            f"{r.get('exit_code', '-')!s:>4} {r.get('left', '-')!s:>4}  {r.get('why', '')[:80]}"
            for r in rows
        ]
        lines.append(
            f"first request answered: {answered}/{n}; its TTFT within {FIRST_RATIO:g}x steady state: "
            f"{quick}/{n}; held by the frontend: {held}/{n}; clean exits: {clean}/{n}"
        )
        text = "\n".join(lines)
        (OUT / f"fresh-{name}.txt").write_text(text + "\n")
        print(text)
        return 0 if answered == n and clean == n and quick == n and not held else 1
    if mode == "stuck":
        row = stuck_engine("disagg", ",".join(gpus[:2]))
        (OUT / "stuck.json").write_text(json.dumps(row, indent=1))
        print(json.dumps(row, indent=1))
        return 0 if row.get("ok") and row.get("exit_code") == 0 and not row.get("left") else 1
    names = argv[1:] or list(EXAMPLES)
    results = []
    for name in names:
        need = EXAMPLES[name][1]
        if need > len(gpus):
            log(f"{name}: needs {need} GPUs, {len(gpus)} here; skipped")
            continue
        results.append(serve_example(name, ",".join(gpus[:need])))
    (OUT / "examples.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    lines = [
        f"{'example':18} {'gpus':8} {'ready s':>7} {'first s':>7} {'checks':>7} {'tok/s':>7} "
        f"{'TTFT ms':>8} {'ITL ms':>7} exit"
    ]
    for r in results:
        ok = sum(r.checks.values())
        clean = r.exit_code == 0 and not r.left_processes
        lines.append(
            f"{r.name:18} {r.gpus:8} {r.ready_s:7.1f} {r.first_s or float('nan'):7.2f} "
            f"{ok:>3}/{len(r.checks):<3} {r.out_tok_s:7.0f} {r.ttft_p50_ms:8.0f} {r.itl_p50_ms:7.1f} "
            f"{'clean' if clean else f'rc={r.exit_code} left={r.left_processes}'}"
            f"{'' if r.passed else '  FAIL ' + '; '.join(r.notes)[:200]}"
        )
    text = "\n".join(lines)
    (OUT / "examples.txt").write_text(text + "\n")
    print(text)
    return 0 if results and all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
