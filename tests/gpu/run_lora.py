"""LoRA adapters on GPUs, the path users take: ``dynamo-run`` of the LoRA examples, against SGLang's server.

usage: python3 tests/gpu/run_lora.py agg|disagg|all      (see tests/gpu/README.md for the device calls)

The model: real random weights, not dummy ones. SGLang reads a LoRA adapter's weights with the model's
``--load-format`` (``LoRAAdapter.initialize_weights``), and ``dummy`` reads no files ("DUMMY load_format
should use DummyModelLoader", the first run on SGLang 0.5.17), so no adapter loads under dummy weights;
our worker refuses that with ``LoraNotSupported``. So the script first writes a Llama folder
(``MODEL_SHAPES``: on GPUs the shape of ``tests/gpu/model``, Llama 3 8B: hidden 4096, 32 layers, 32 heads
/ 8 KV heads, MLP 14336, vocab 128256: 8.0B parameters, 16 GB of bfloat16 in ``model.safetensors``, seed
1; ``tests/support/random_llama.py``, the standard library only, written in 24 s on an H200 host) with
the GPU proofs' tokenizer (token *i* is ``w<i>``, ``run_gpu.make_model``) into ``$GPU_STATE/lora-model``
(reused while its config is the same), and serves it with ``--load-format auto`` (``real_weights``) on
both our stack and SGLang's server. ``ENGINE=mocker`` writes the same files, tiny (the mocker reads the
config and the tokenizer), and serves them through ``--model-dir``.

Adapters: four PEFT adapters with random weights for that model (``tests/support/peft_adapters.py``;
ranks 8 and 16 alternating, every attention and MLP projection: within the examples' ``--max-lora-rank
16`` and ``--lora-target-modules``), so each changes the output, and differently.

Phase ``agg`` (1 GPU): ``dynamo-run`` of ``examples/lora-agg.yaml``, with only what a user of this
machine changes (``run_examples``: the model folder, ``USER_FLAGS`` with ``--load-format auto``) and
its ``DynamoModel`` documents pointed at the generated adapters.
The adapters are served as ``dynamo-run`` applies them; those it did not apply within ``APPLY_S`` (a
``dynamo-run`` without ``DynamoModel`` support), and the extra ones up to four, are loaded as the
operator does: ``POST /v1/loras`` on every worker. Then, with the official ``openai`` client:

- ``/v1/models`` lists every adapter with ``parent`` the served model;
- greedy completions (``PROBES`` prompts of token ids, ``PROBE_OUT`` tokens, ``ignore_eos``) of the
  base model and of each adapter, by name, and one as ``<model>:<adapter>`` (equal to that adapter's
  second request by name: both read the same cached prefix);
- a mixed load: ``NREQ`` completions of ``ISL``/``OSL`` tokens, ``CONC`` at once, cycling over the four
  adapters and the base model, after an untimed warm-up pass: output tokens/s and errors. It is sent
  with aiohttp, as SGLang's is below, so both stacks pay the same client (the ``openai`` client's own
  cost per request halved ours on this fast model).

Then (``ENGINE=sglang``) the same on SGLang's own server on the same GPU: ``sglang.launch_server`` with
the same flags, ``--lora-paths`` for the four adapters, driven through its ``/generate`` with
``input_ids`` and ``lora_path``. Passes when every greedy output equals SGLang's (and each adapter's
differs from the base model's) and the mixed load's throughput is at least ``MIN_RATIO`` (0.95) of
SGLang's, with 0 errors. The load also runs on SGLang streamed (``"stream": true``, its own prompts),
reported beside it and not judged: the two SGLang figures tell what the per-step hand-over of tokens
costs on this model. (Our frontend asks the worker for a non-streamed request's tokens every 50 steps,
``GenerateRequest.stream_interval``, as SGLang's server does for its own non-streamed requests.)

Phase ``disagg`` (2 GPUs): ``dynamo-run`` of ``lora-disagg.yaml`` (prefill + decode), the same adapters
loaded on both, the same greedy probes (equal to SGLang's aggregated server, run afterwards on the
first GPU) and the mixed load: 0 errors.

``ENGINE=mocker`` runs the same on the simulated engine (SGLang's server is skipped; a tiny model):
the suite does, to keep the script working between runs on the lent machines. Everything printed and
every log lands in ``$OUT``; the summary is printed last and ``$OUT/lora.json`` holds the figures; the
exit status is 1 when a check failed.

Env: ENGINE, GRAPH_GPUS, ISL (1024), OSL (128), NREQ (160), CONC (32), PROBES (4), PROBE_OUT (32),
APPLY_S (60), MIN_RATIO (0.95), WARMUP_REQ (64: untimed requests of the mixed load before it is timed,
in both stacks, so neither pays for compiling the LoRA kernels), STARTUP_S, GPU_STATE (the model and the
adapters), OUT.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
import run_examples as ex  # noqa: E402  (the same Graph, flags and model as the user-path proof)

from tests.support.peft_adapters import DEFAULT_TARGETS, write_adapter  # noqa: E402
from tests.support.random_llama import llama_config, parameter_count, write_random_llama  # noqa: E402

ISL, OSL, NREQ, CONC = (
    int(os.environ.get(k, d)) for k, d in (("ISL", 1024), ("OSL", 128), ("NREQ", 160), ("CONC", 32))
)
WARMUP_REQ = int(os.environ.get("WARMUP_REQ", 64))  # untimed requests before each stack's mixed load
PROBES, PROBE_OUT = int(os.environ.get("PROBES", 4)), int(os.environ.get("PROBE_OUT", 32))
APPLY_S = float(os.environ.get("APPLY_S", 60))
MIN_RATIO = float(os.environ.get("MIN_RATIO", 0.95))
ADAPTERS = 4
LORA_FLAG_PREFIXES = ("--enable-lora", "--max-lora", "--lora-", "--max-loaded-loras", "--max-loras-per-batch")
STATE = Path(os.environ.get("GPU_STATE") or "/tmp/dynamo-gpu-state")
# The served model: real random weights (SGLang loads an adapter with the model's --load-format, and
# dummy reads no files). On GPUs the 8B shape of the other proofs (16 GB, written in 24 s on the device,
# reused while its config is the same); on the mocker, which reads only config.json and the tokenizer, tiny.
MODEL_SHAPES = {
    "sglang": {  # tests/gpu/model's shape (Llama 3 8B), as the issue asks
        "hidden": 4096,
        "layers": 32,
        "heads": 32,
        "kv_heads": 8,
        "intermediate": 14336,
        "vocab": 128256,
        "bos": 128000,
        "eos": 128001,
    },
    "mocker": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "vocab": 1000},
}
LORA_MODEL_DIR = STATE / "lora-model"


def log(msg: str) -> None:
    ex.log(msg)


# --- the adapters and the manifest -------------------------------------------------------------------


def example(phase: str) -> Path:
    return ex.ROOT / "examples" / f"lora-{phase}.yaml"


def declared_models(docs: list[dict]) -> list[dict]:
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == "DynamoModel"]


def adapter_names(docs: list[dict]) -> list[str]:
    """The DynamoModels' names, then ``lora-N`` up to four adapters."""
    names = [str(d["spec"]["modelName"]) for d in declared_models(docs)]
    n = 1
    while len(names) < ADAPTERS:
        if f"lora-{n}" not in names:
            names.append(f"lora-{n}")
        n += 1
    return names[:ADAPTERS]


def make_model(folder: Path) -> dict:
    """The served model: ``MODEL_SHAPES[ENGINE]`` with real random weights (``random_llama``, seed 1)
    and the tokenizer of the GPU proofs (token *i* is ``w<i>``, ``run_gpu.make_model``); its config."""
    from run_gpu import make_model as with_tokenizer

    config = llama_config(**MODEL_SHAPES[ex.ENGINE])
    started = time.monotonic()
    write_random_llama(folder, config, seed=1)
    with_tokenizer(folder, config)
    log(f"model {folder}: {parameter_count(config) / 1e6:.1f}M parameters, real random weights, "
        f"{time.monotonic() - started:.1f} s")  # fmt: skip
    return config


def real_weights(flags: list[str]) -> list[str]:
    """``flags`` with ``--load-format auto`` in place of ``dummy`` (the weights are read from files)."""
    out = list(flags)
    for i, flag in enumerate(out[:-1]):
        if flag == "--load-format":
            out[i + 1] = "auto"
    return out if "--load-format" in out else [*out, "--load-format", "auto"]


def make_adapters(names: list[str], config: dict, folder: Path) -> dict[str, Path]:
    """A PEFT adapter per name, rank 8 and 16 alternating, every attention and MLP projection, for the
    served model's shapes."""
    return {
        name: write_adapter(
            config, folder / name, rank=8 if i % 2 == 0 else 16, seed=i + 1, targets=DEFAULT_TARGETS
        )
        for i, name in enumerate(names)
    }


def user_manifest(phase: str, adapters: dict[str, Path], folder: Path) -> tuple[Path, list[str]]:
    """The example as a user of this machine runs it (``run_examples.user_graph``), its DynamoModels
    pointed at the generated adapters; and the names of those DynamoModels."""
    docs = [d for d in yaml.safe_load_all(example(phase).read_text()) if d is not None]
    for doc in docs:
        if doc.get("kind") == "DynamoGraphDeployment":
            ex.user_graph(doc)
    for model in declared_models(docs):
        model["spec"]["source"]["uri"] = f"file://{adapters[str(model['spec']['modelName'])]}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"lora-{phase}.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path, [str(m["spec"]["modelName"]) for m in declared_models(docs)]


def lora_flags(phase: str) -> list[str]:
    """The LoRA flags and page size of the example's first SGLang worker (for SGLang's own server)."""
    docs = [d for d in yaml.safe_load_all(example(phase).read_text()) if d is not None]
    graph = next(d for d in docs if d.get("kind") == "DynamoGraphDeployment")
    args = [str(a) for a in (ex._containers(graph)[-1].get("args") or [])]
    flags, keep = [], False
    for a in args:
        if a.startswith("--"):
            keep = a.startswith(LORA_FLAG_PREFIXES) or a == "--page-size"
        if keep:
            flags.append(a)
    return flags


# --- our stack --------------------------------------------------------------------------------------


def http(method: str, url: str, body: dict | None = None, timeout: float = 120) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def listed(graph: ex.Graph) -> dict[str, dict]:
    status, body = http("GET", f"{graph.base}/models")
    return {m["id"]: m for m in body.get("data", [])} if status == 200 else {}


def workers(graph: ex.Graph) -> list[int]:
    """The system ports that answer ``/v1/loras`` (the workers'; LoRA on)."""
    out = []
    for port in graph.system_ports():
        try:
            status, _ = http("GET", f"http://127.0.0.1:{port}/v1/loras", timeout=10)
        except (OSError, ValueError):
            continue
        if status == 200:
            out.append(port)
    return out


def serve_adapters(graph: ex.Graph, adapters: dict[str, Path], declared: list[str], row: dict) -> None:
    """Every adapter listed by the frontend: the declared ones as dynamo-run applies them (within
    ``APPLY_S``), the rest (and those it did not apply) loaded on every worker through ``/v1/loras``."""
    deadline = time.monotonic() + (APPLY_S if declared else 0)
    while declared and time.monotonic() < deadline and not set(declared) <= set(listed(graph)):
        time.sleep(1)
    applied = [n for n in declared if n in listed(graph)]
    row["applied_by_dynamo_run"] = applied
    ports = workers(graph)
    row["workers_with_lora"] = len(ports)
    for name, folder in adapters.items():
        if name in applied:
            continue
        for port in ports:
            status, body = http(
                "POST",
                f"http://127.0.0.1:{port}/v1/loras",
                {"lora_name": name, "source": {"uri": f"file://{folder}"}},
            )
            if status != 200:
                raise RuntimeError(f"loading {name} on the worker at port {port} answered {status}: {body}")
    deadline = time.monotonic() + 60
    while not set(adapters) <= set(listed(graph)):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the frontend lists {sorted(listed(graph))}, not every adapter of {sorted(adapters)}"
            )
        time.sleep(0.5)
    models = listed(graph)
    row["checks"]["adapters_listed_with_parent"] = all(
        models[n].get("parent") == graph.model for n in adapters
    )


def ids_of(text: str) -> list[int]:
    """The token ids of a completion's text (the model's token i is ``w<i>``)."""
    return [int(w[1:]) for w in text.split() if w[:1] == "w" and w[1:].isdigit()]


def top_id() -> int:
    """Prompts are made of token ids from 100 to this (below the vocab; no special token)."""
    return int(MODEL_SHAPES[ex.ENGINE]["vocab"]) - 100


def probe_prompts() -> list[list[int]]:
    rng = random.Random(11)
    return [[rng.randrange(100, top_id()) for _ in range(300)] for _ in range(PROBES)]


async def ours_greedy(graph: ex.Graph, adapters: list[str]) -> dict[str, list[str]]:
    """Greedy completions of every probe for the base model and each adapter, then the first adapter as
    ``<model>:<adapter>`` and again by name (``again(...)``): those two are each the second request of
    their prompt in the adapter's cache namespace, so both read the same cached prefix and must answer
    the same, token for token (``colon_is_adapter``)."""
    import openai

    out: dict[str, list[str]] = {}
    colon = f"{graph.model}:{adapters[0]}"
    async with openai.AsyncOpenAI(base_url=graph.base, api_key="none", max_retries=0, timeout=300) as c:
        asks = [(m, m) for m in [graph.model, *adapters, colon]] + [(again(adapters[0]), adapters[0])]
        for key, model in asks:
            texts = []
            for ids in probe_prompts():
                r = await c.completions.create(
                    model=model,
                    prompt=ids,
                    max_tokens=PROBE_OUT,
                    temperature=0,
                    extra_body={"ignore_eos": True},
                )
                texts.append(r.choices[0].text)
            out[key] = texts
    return out


def again(adapter: str) -> str:
    return f"{adapter} (again)"


def colon_is_adapter(colon: list[str], adapter_again: list[str], base: list[str]) -> bool:
    """Whether the ``<model>:<adapter>`` completions are the adapter's: equal to the adapter's by name
    under the same cache state (its repeat, ``ours_greedy``), and not the base model's. Not compared with
    the adapter's first request: a request that reads its prefix from the cache computes it with other
    kernels, and random weights leave near-ties that such rounding flips (on the 8B shape from the first
    token on)."""
    return colon == adapter_again and colon != base


def mixed_requests(models: list[str], n: int = 0, seed: int = 5) -> list[tuple[str, list[int]]]:
    """``n`` (default ``NREQ``) requests cycling over ``models``, prompts drawn from ``seed``: each pass
    of a load draws its own (the warm-up ``seed + 1``), so a timed pass finds none of its prefixes cached."""
    rng = random.Random(seed)
    return [
        (models[i % len(models)], [rng.randrange(100, top_id()) for _ in range(ISL)])
        for i in range(n or NREQ)
    ]


async def timed_load(
    models: list[str], send: Callable[[Any, str, list[int]], Awaitable[int]], seed: int = 5
) -> dict:
    """The mixed load: an untimed warm-up pass (``WARMUP_REQ`` requests: whichever stack runs first would
    otherwise pay for compiling the LoRA kernels), then ``NREQ`` requests, ``CONC`` at once, timed; the
    prompts from ``seed`` (a second load on the same server takes another, else it finds them cached).
    ``send(session, model, ids)`` sends one and returns its output tokens. Both stacks are driven by the
    same aiohttp client, so the client's own cost is the same for both."""
    import aiohttp

    sem = asyncio.Semaphore(CONC)

    async def one(s: Any, name: str, ids: list[int], counts: dict) -> None:
        async with sem:
            try:
                n = await send(s, name, ids)
            except (TimeoutError, RuntimeError, aiohttp.ClientError) as e:
                counts["errors"].append(f"{name}: {e}"[:200])
                return
            counts["tokens"] += n

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=CONC)) as s:
        warm: dict = {"tokens": 0, "errors": []}
        warmup = mixed_requests(models, WARMUP_REQ, seed + 1)
        await asyncio.gather(*(one(s, m, ids, warm) for m, ids in warmup))
        counts: dict = {"tokens": 0, "errors": []}
        start = time.perf_counter()
        await asyncio.gather(*(one(s, m, ids, counts) for m, ids in mixed_requests(models, seed=seed)))
        seconds = time.perf_counter() - start
    errors = warm["errors"] + counts["errors"]
    return {
        "tok_s": counts["tokens"] / seconds,
        "tokens": counts["tokens"],
        "errors": len(errors),
        "first_errors": errors[:3],
    }


async def ours_load(graph: ex.Graph, models: list[str]) -> dict:
    """The mixed load through our frontend's ``/v1/completions``: output tokens/s and errors."""

    async def send(s: Any, model: str, ids: list[int]) -> int:
        body = {"model": model, "prompt": ids, "max_tokens": OSL, "temperature": 0, "ignore_eos": True}
        async with s.post(f"{graph.base}/completions", json=body) as r:
            text = await r.text()
            if r.status != 200:
                raise RuntimeError(f"/v1/completions answered {r.status}: {text[:300]}")
            return int(json.loads(text)["usage"]["completion_tokens"])

    return await timed_load(models, send)


def run_ours(phase: str, gpus: str, adapters: dict[str, Path], row: dict) -> None:
    manifest, declared = user_manifest(phase, adapters, ex.OUT / "manifests")
    # the mocker serves the same model folder's config and tokenizer (on GPUs Graph passes MODEL_DIR)
    run_args = () if ex.ENGINE == "sglang" else ("--model-dir", str(ex.MODEL_DIR))
    graph = ex.Graph(f"lora-{phase}", manifest, gpus, run_args=run_args)
    try:
        row["ready_s"] = round(graph.ready_s, 1)
        serve_adapters(graph, adapters, declared, row)
        names = list(adapters)
        greedy = asyncio.run(ours_greedy(graph, names))
        row["ours_greedy"] = greedy
        row["checks"]["base_model_colon_adapter_is_the_adapter"] = colon_is_adapter(
            greedy[f"{graph.model}:{names[0]}"], greedy[again(names[0])], greedy[graph.model]
        )
        row["checks"]["adapters_change_the_output"] = all(greedy[n] != greedy[graph.model] for n in names)
        row["ours_load"] = asyncio.run(ours_load(graph, [graph.model, *names]))
        row["checks"]["mixed_load_0_errors"] = row["ours_load"]["errors"] == 0
        row["model"] = graph.model
    finally:
        row["exit_code"], left = graph.stop()
        row["checks"]["clean_exit"] = row["exit_code"] == 0 and not left


# --- SGLang's own server -----------------------------------------------------------------------------


class Native:
    """``sglang.launch_server`` with the example's LoRA flags, ``USER_FLAGS`` and ``--lora-paths``."""

    def __init__(self, phase: str, gpu: str, adapters: dict[str, Path]) -> None:
        self.port = ex.free_port()
        flags = [
            *lora_flags(phase),
            *ex.USER_FLAGS,
            "--lora-paths",
            *(f"{n}={p}" for n, p in adapters.items()),
        ]
        argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(ex.MODEL_DIR),
                "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(self.port), *flags]  # fmt: skip
        self.log_path = ex.OUT / "logs" / f"sglang-native-{phase}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._out = self.log_path.open("w")
        log(f"native: {' '.join(argv)}")
        self.proc = subprocess.Popen(
            argv, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu},
        )  # fmt: skip
        deadline = time.monotonic() + ex.STARTUP_S
        while True:
            try:
                if http("GET", f"http://127.0.0.1:{self.port}/health", timeout=5)[0] == 200:
                    break
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sglang.launch_server did not start; see {self.log_path}")
            time.sleep(1)

    async def generate(self, session, ids: list[int], n: int, lora: str | None, stream: bool = False) -> dict:
        """One greedy ``/generate`` of ``n`` tokens (``lora_path`` for an adapter): SGLang's answer, or
        streamed (as our worker asks SGLang for every request), its last event."""
        body: dict = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
            "stream": stream,
        }
        if lora is not None:
            body["lora_path"] = lora
        async with session.post(f"http://127.0.0.1:{self.port}/generate", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"SGLang /generate answered {r.status}: {(await r.text())[:300]}")
            if not stream:
                return json.loads(await r.text())
            last: dict = {}
            async for raw in r.content:  # server-sent events: "data: {...}", then "data: [DONE]"
                line = raw.decode().strip()
                if line.startswith("data:") and line != "data: [DONE]":
                    last = json.loads(line[5:])
            if not last:
                raise RuntimeError("SGLang /generate streamed no event")
            return last

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._out.close()


async def native_greedy(native: Native, model: str, adapters: list[str]) -> dict[str, list[list[int]]]:
    """SGLang's greedy token ids of every probe, for the base model and each adapter."""
    import aiohttp

    out = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        for name in [model, *adapters]:
            lora = None if name == model else name
            answers = [await native.generate(s, ids, PROBE_OUT, lora) for ids in probe_prompts()]
            out[name] = [a["output_ids"][:PROBE_OUT] for a in answers]
    return out


async def native_load(native: Native, models: list[str], model: str, stream: bool = False) -> dict:
    """The same mixed load on SGLang's ``/generate`` (``lora_path`` for an adapter); ``stream``: each
    request streamed (the scheduler then hands over every new token at every step, as for a streaming
    client's request through our worker; a non-streamed one gets its tokens every 50 steps)."""

    async def send(s: Any, name: str, ids: list[int]) -> int:
        answer = await native.generate(s, ids, OSL, None if name == model else name, stream)
        return int(answer["meta_info"]["completion_tokens"])

    # the streamed load runs second on the same server: its own prompts, none of them cached
    return await timed_load(models, send, seed=7 if stream else 5)


def run_native(phase: str, gpu: str, adapters: dict[str, Path], row: dict, with_load: bool) -> None:
    model, names = row["model"], list(adapters)
    native = Native(phase, gpu, adapters)
    try:
        greedy = asyncio.run(native_greedy(native, model, names))
        if with_load:
            row["native_load"] = asyncio.run(native_load(native, [model, *names], model))
            row["native_load_streamed"] = asyncio.run(native_load(native, [model, *names], model, True))
    finally:
        native.stop()
    ours = row["ours_greedy"]  # text of the model's tokens: token i is "w<i>"
    equal = sum(ids_of(ours[m][i]) == greedy[m][i] for m in greedy for i in range(PROBES))
    row["greedy_equal"] = f"{equal}/{len(greedy) * PROBES}"
    row["checks"]["greedy_equals_sglang"] = equal == len(greedy) * PROBES
    if with_load:
        ratio = row["ours_load"]["tok_s"] / max(row["native_load"]["tok_s"], 1e-9)
        row["throughput_ratio"] = round(ratio, 3)
        row["checks"][f"throughput_at_least_{MIN_RATIO}x_sglang"] = ratio >= MIN_RATIO
        streamed = row["ours_load"]["tok_s"] / max(row["native_load_streamed"]["tok_s"], 1e-9)
        row["throughput_ratio_streamed"] = round(streamed, 3)  # told, not judged: what the stream costs


# --- the phases ---------------------------------------------------------------------------------------


@dataclass
class Row:
    phase: str
    gpus: str
    checks: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def phase(name: str, gpus: list[str], config: dict) -> dict:
    need = 1 if name == "agg" else 2
    row: dict = asdict(Row(name, ",".join(gpus[:need])))
    if len(gpus) < need:
        row["notes"].append(f"needs {need} GPUs, {len(gpus)} given; skipped")
        return row
    adapters = make_adapters(
        adapter_names(list(yaml.safe_load_all(example(name).read_text()))), config, STATE / "adapters"
    )
    row["adapters"] = {n: str(p) for n, p in adapters.items()}
    try:
        run_ours(name, row["gpus"], adapters, row)
        if ex.ENGINE == "sglang":
            run_native(name, gpus[0], adapters, row, with_load=name == "agg")
    except (
        Exception
    ) as e:  # a failed phase is reported with the rest, never a traceback in place of the table
        row["checks"]["no_exception"] = False
        row["notes"].append(f"{type(e).__name__}: {str(e)[:500]}")
    log(f"lora {name}: {json.dumps({k: v for k, v in row.items() if k != 'ours_greedy'})}")
    return row


def summary(rows: list[dict]) -> tuple[str, bool]:
    lines = [
        f"{'phase':7} {'gpus':5} {'ready s':>7} {'greedy = sglang':>15} {'ours tok/s':>10} "
        f"{'sglang tok/s':>12} {'ratio':>6} {'errors':>6} {'streamed tok/s':>14} {'ratio':>6}"
    ]
    ok = True
    for r in rows:
        ours, native = r.get("ours_load") or {}, r.get("native_load") or {}
        lines.append(
            f"{r['phase']:7} {r['gpus']:5} {r.get('ready_s', '-')!s:>7} {r.get('greedy_equal', '-'):>15} "
            f"{ours.get('tok_s', 0):10.0f} {native.get('tok_s', 0):12.0f} "
            f"{r.get('throughput_ratio', '-')!s:>6} {ours.get('errors', '-')!s:>6} "
            f"{(r.get('native_load_streamed') or {}).get('tok_s', 0):14.0f} "
            f"{r.get('throughput_ratio_streamed', '-')!s:>6}"
        )
        failed = [k for k, v in r["checks"].items() if not v]
        ok &= bool(r["checks"]) and not failed
        if failed or r["notes"]:
            lines.append(f"        failed: {', '.join(failed) or '-'}; {'; '.join(r['notes'])}")
    lines.append(f"RESULT: {'PASS' if ok else 'FAIL'}")
    return "\n".join(lines), ok


def main(argv: list[str]) -> int:
    which = argv[0] if argv else "all"
    if which not in ("agg", "disagg", "all"):
        print(__doc__)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ex.OUT.mkdir(parents=True, exist_ok=True)
    STATE.mkdir(parents=True, exist_ok=True)
    # what a user of this machine changes in the examples: the model folder, and its weights read
    ex.MODEL_DIR = LORA_MODEL_DIR
    ex.USER_FLAGS = real_weights(ex.USER_FLAGS)
    config = make_model(LORA_MODEL_DIR)
    gpus = ex.gpu_list()
    rows = [phase(name, gpus, config) for name in (["agg", "disagg"] if which == "all" else [which])]
    (ex.OUT / "lora.json").write_text(json.dumps(rows, indent=1))
    text, ok = summary(rows)
    (ex.OUT / "lora.txt").write_text(text + "\n")
    print(text, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
