"""GPU proof of embeddings and structured output: our frontend + SGLang worker on one GPU.

usage: python tests/gpu/run_gpu_features.py      (see tests/gpu/README.md for the device calls)

Phase ``embed``: an embedding model shape (a 4-layer Llama, hidden size 1024, dummy weights, SGLang
``--is-embedding``: last-token pooling, normalized) served by our SGLang worker through our frontend,
and the same model with the same flags and seed by SGLang's own server (``sglang.launch_server``), both
on GPU 0. For the same inputs (token-id lists of 5 to 300 ids, in one batch and one by one, and a text)
our ``/v1/embeddings`` must return vectors of the model's size equal to SGLang's ``/v1/embeddings``
(cosine >= 0.999 and max |difference| <= 0.02: bf16 weights, batches formed differently); base64 must
decode to the float answer, usage must count the tokens, and the worker's ``/health`` (an embedding
canary) must be 200.

Phase ``json``: a generation model of the same shape (dummy weights, a byte-level BPE tokenizer so JSON
can be spelled) served by our SGLang worker with ``--grammar-backend xgrammar``. Chat requests with
``response_format`` ``json_schema`` (and ``json_object``, and ``tool_choice`` naming a function)
through our frontend must return JSON that validates against the schema: with random weights only the
grammar can make that happen.

``ENGINE=mocker`` runs the same script on the simulated engine (no GPU, no SGLang: the comparison with
SGLang's server is skipped), as the test suite does. Everything printed and every log lands in
``$OUT``; the summary is printed last (also ``$OUT/features_summary.txt``); exit 1 when a check failed.
Env: ENGINE (sglang|mocker), STARTUP_S.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import signal
import struct
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_gpu import OUT, Proc, free_port, healthy, log, wait_http

ENGINE = os.environ.get("ENGINE", "sglang")
STARTUP_S = float(os.environ.get("STARTUP_S", 420))
WORK = Path(os.environ.get("FEATURES_DIR") or "/tmp/dynamo-gpu-features")
NAMESPACE = "gpu-features"
SHAPE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
COMMON_FLAGS = [
    "--load-format", "dummy", "--random-seed", "1", "--attention-backend", "triton",
    "--sampling-backend", "pytorch", "--cuda-graph-backend-prefill", "disabled",
    "--cuda-graph-backend-decode", "disabled", "--mm-feature-transport", "cpu", "--skip-server-warmup",
    "--context-length", "2048", "--base-gpu-id", "0",
]  # fmt: skip
EMBED_FLAGS = [*COMMON_FLAGS, "--is-embedding", "--grammar-backend", "none", "--mem-fraction-static", "0.3"]
JSON_FLAGS = [
    *COMMON_FLAGS, "--grammar-backend", "xgrammar", "--constrained-json-disable-any-whitespace",
    "--mem-fraction-static", "0.6",
]  # fmt: skip
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
        "sunny": {"type": "boolean"},
        "level": {"type": "integer", "enum": [1, 2, 3]},
        "note": {"type": "string", "enum": ["ok", "warm", "cold"]},
    },
    "required": ["city", "sunny", "level", "note"],
    "additionalProperties": False,
}
TOOL = {"type": "function", "function": {"name": "set_weather", "parameters": SCHEMA}}


# --- model folders ------------------------------------------------------------------------------------


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1))


def embed_model(folder: Path) -> Path:
    """The embedding shape with a word-level tokenizer (token i is ``w<i>``), as run_gpu.py's model."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = 32000
    write_json(
        folder / "config.json", SHAPE | {"vocab_size": vocab_size, "bos_token_id": 1, "eos_token_id": 2}
    )
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "w1",
            "eos_token": "w2",
            "add_bos_token": False,
        },
    )
    return folder


def json_model(folder: Path) -> Path:
    """The generation shape with the tiny byte-level BPE tokenizer (any JSON can be spelled in it)."""
    from dynamo_worker.tinymodel import ensure_tiny_model
    from tokenizers import Tokenizer

    tiny = ensure_tiny_model(WORK / "tiny")
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (folder / name).write_bytes((tiny / name).read_bytes())
    vocab = Tokenizer.from_file(str(tiny / "tokenizer.json")).get_vocab_size()
    eos = json.loads((tiny / "generation_config.json").read_text())["eos_token_id"]
    write_json(folder / "config.json", SHAPE | {"vocab_size": vocab, "bos_token_id": 0, "eos_token_id": eos})
    return folder


# --- processes ----------------------------------------------------------------------------------------


class Stack:
    def __init__(self) -> None:
        self.procs: list[Proc] = []
        self.nats_port, self.http_port = free_port(), free_port()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v1"

    def add(self, name: str, cmd: list[str]) -> Proc:
        proc = Proc(name, cmd).start()
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        import shutil

        binary = shutil.which("nats-server") or str(Path(sys.executable).parent / "nats-server")
        self.add(
            "nats", [binary, "-a", "127.0.0.1", "-p", str(self.nats_port), "-js", "-sd", str(WORK / "nats")]
        )
        frontend = self.add("frontend", [
            sys.executable, "-m", "dynamo_worker.frontend", "--http-host", "127.0.0.1", "--http-port",
            str(self.http_port), "--namespace", NAMESPACE, "--nats-server", f"nats://127.0.0.1:{self.nats_port}",
        ])  # fmt: skip
        wait_http(frontend, f"http://127.0.0.1:{self.http_port}/live", 60)

    def worker(self, name: str, model_dir: Path, flags: list[str]) -> tuple[Proc, int]:
        system_port = free_port()
        module = "dynamo_worker.sglang" if ENGINE == "sglang" else "dynamo_worker.mocker"
        cmd = [sys.executable, "-m", module, "--model-path", str(model_dir), "--served-model-name", name,
               "--port", str(free_port()), *flags, "--namespace", NAMESPACE, "--component", name,
               "--nats-server", f"nats://127.0.0.1:{self.nats_port}", "--system-port", str(system_port),
               "--request-port", "0", "--listen-host", "127.0.0.1", "--advertise-host", "127.0.0.1",
               "--graceful-shutdown-s", "5"]  # fmt: skip
        if ENGINE == "sglang":
            cmd += ["--canary-interval-s", "5"]
        proc = self.add(name, cmd)
        wait_http(proc, f"http://127.0.0.1:{system_port}/health", STARTUP_S)
        return proc, system_port

    def native(self, model_dir: Path, flags: list[str]) -> tuple[Proc, int]:
        port = free_port()
        proc = self.add("sglang-native", [
            sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir),
            "--served-model-name", "embed", "--host", "127.0.0.1", "--port", str(port), *flags,
        ])  # fmt: skip
        wait_http(proc, f"http://127.0.0.1:{port}/health", STARTUP_S)
        return proc, port

    def stop(self, proc: Proc) -> None:
        proc.stop(grace_s=30)
        self.procs.remove(proc)

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop(grace_s=5 if proc.name in ("frontend", "nats") else 30)
        self.procs.clear()


async def wait_listed(client, model: str, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while not any(m.id == model for m in (await client.models.list()).data):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the frontend does not list {model} after {limit_s:.0f}s")
        await asyncio.sleep(0.5)


# --- checks ---------------------------------------------------------------------------------------------


def compare(ours: list[float], theirs: list[float]) -> tuple[float, float]:
    dot = sum(a * b for a, b in zip(ours, theirs, strict=True))
    cos = dot / ((math.sqrt(sum(a * a for a in ours)) * math.sqrt(sum(b * b for b in theirs))) or 1.0)
    return cos, max(abs(a - b) for a, b in zip(ours, theirs, strict=True))


def native_embeddings(port: int, inputs: object) -> list[list[float]]:
    body = json.dumps({"model": "embed", "input": inputs}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/embeddings", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return [d["embedding"] for d in sorted(json.loads(r.read())["data"], key=lambda d: d["index"])]


def valid(value: object, schema: dict) -> bool:
    """Enough of JSON Schema for SCHEMA: object, required, additionalProperties, enum, types."""
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict) or not set(schema.get("required", [])) <= set(value):
            return False
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is False and not set(value) <= set(props):
            return False
        return all(valid(v, props[k]) for k, v in value.items() if k in props)
    types = {"string": str, "boolean": bool, "integer": int, "number": (int, float)}
    if kind not in types:
        return True
    return isinstance(value, types[kind]) and not (kind == "integer" and isinstance(value, bool))


async def phase_embed(stack: Stack, checks: dict[str, str], notes: list[str]) -> None:
    import openai

    model_dir = embed_model(WORK / "embed-model")
    _, system_port = stack.worker("embed", model_dir, EMBED_FLAGS)
    native_port = None
    if ENGINE == "sglang":
        _, native_port = stack.native(model_dir, EMBED_FLAGS)
    inputs = [list(range(5, 10)), list(range(100, 117)), list(range(1000, 1064)), list(range(2000, 2300))]
    text = "w5 w6 w7 w8 w9"
    async with openai.AsyncOpenAI(base_url=stack.base, api_key="none", max_retries=0, timeout=300) as client:
        await wait_listed(client, "embed")
        batch = await client.embeddings.create(model="embed", input=inputs)
        ours = [d.embedding for d in batch.data]
        single = [
            (await client.embeddings.create(model="embed", input=ids)).data[0].embedding for ids in inputs
        ]
        from_text = (await client.embeddings.create(model="embed", input=text)).data[0].embedding
        raw = await client.embeddings.with_raw_response.create(
            model="embed", input=inputs[0], encoding_format="base64"
        )
        b64 = json.loads(raw.text)["data"][0]["embedding"]
    size = SHAPE["hidden_size"]
    checks["embed vector_size"] = f"{sum(len(v) == size for v in ours)}/{len(ours)}"
    checks["embed usage_counts_tokens"] = (
        "1/1" if batch.usage.prompt_tokens == sum(map(len, inputs)) else "0/1"
    )
    decoded = struct.unpack(f"<{size}f", base64.b64decode(b64))
    checks["embed base64_equals_float"] = (
        "1/1" if max(abs(a - b) for a, b in zip(decoded, single[0], strict=True)) < 1e-6 else "0/1"
    )
    checks["embed text_equals_ids"] = "1/1" if compare(from_text, single[0])[0] > 0.999 else "0/1"
    checks["embed health_after_load"] = healthy(system_port)
    if native_port is not None:
        theirs = native_embeddings(native_port, inputs)
        theirs_text = native_embeddings(native_port, text)[0]
        pairs = [*zip(ours, theirs, strict=True), *zip(single, theirs, strict=True), (from_text, theirs_text)]
        stats = [compare(a, b) for a, b in pairs]
        good = sum(cos >= 0.999 and diff <= 0.02 for cos, diff in stats)
        checks["embed equal_native"] = f"{good}/{len(stats)}"
        notes.append(
            f"embed vs SGLang /v1/embeddings: min cosine {min(c for c, _ in stats):.6f}, "
            f"max |diff| {max(d for _, d in stats):.5f} over {len(stats)} vectors of {size}"
        )
    else:
        notes.append("embed: ENGINE=mocker, no SGLang server to compare with")
    for proc in [p for p in stack.procs if p.name in ("embed", "sglang-native")]:
        stack.stop(proc)


async def phase_json(stack: Stack, checks: dict[str, str], notes: list[str]) -> None:
    import openai

    model_dir = json_model(WORK / "json-model")
    stack.worker("gen", model_dir, JSON_FLAGS)
    messages = [{"role": "user", "content": "Describe the weather as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}
    async with openai.AsyncOpenAI(base_url=stack.base, api_key="none", max_retries=0, timeout=300) as client:
        await wait_listed(client, "gen")
        outputs = []
        for seed in range(6):
            r = await client.chat.completions.create(
                model="gen",
                messages=messages,
                response_format=fmt,
                max_tokens=200,
                temperature=1.0,
                seed=seed,
            )
            outputs.append(r.choices[0].message.content or "")
        stream = await client.chat.completions.create(
            model="gen", messages=messages, response_format=fmt, max_tokens=200, seed=7, stream=True
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        obj = await client.chat.completions.create(
            model="gen", messages=messages, response_format={"type": "json_object"}, max_tokens=200, seed=8
        )
        named = await client.chat.completions.create(
            model="gen",
            messages=messages,
            tools=[TOOL],
            tool_choice={"type": "function", "function": {"name": "set_weather"}},
            max_tokens=200,
            seed=9,
        )

    def parses(text: str, schema: dict | None) -> bool:
        try:
            value = json.loads(text)
        except ValueError:
            return False
        return valid(value, schema) if schema else isinstance(value, dict)

    good = sum(parses(t, SCHEMA) for t in [*outputs, streamed])
    checks["json json_schema_validates"] = f"{good}/{len(outputs) + 1}"
    content = obj.choices[0].message.content or ""
    checks["json json_object_is_object"] = "1/1" if parses(content, None) else "0/1"
    calls = named.choices[0].message.tool_calls or []
    ok = (
        len(calls) == 1
        and calls[0].function.name == "set_weather"
        and parses(calls[0].function.arguments, SCHEMA)
    )
    checks["json named_tool_call_validates"] = "1/1" if ok else "0/1"
    notes.append(f"json examples: {outputs[:2]} / tool arguments {[c.function.arguments for c in calls]}")


def summary(checks: dict[str, str], notes: list[str], error: str | None) -> tuple[str, bool]:
    ok = error is None and bool(checks)
    lines = [f"== GPU features summary: ENGINE={ENGINE} ==", "", f"{'check':40} result"]
    for name, value in checks.items():
        good, total = value.split("/")
        ok &= good == total
        lines.append(f"{name:40} {value}")
    if ENGINE == "sglang" and "embed equal_native" not in checks:
        ok = False
        lines.append(f"{'embed equal_native':40} not run")
    lines += ["", *notes]
    if error:
        lines.append(f"FAILED: {error}")
    lines += ["", f"RESULT: {'PASS' if ok else 'FAIL'}"]
    return "\n".join(lines), ok


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    OUT.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    checks: dict[str, str] = {}
    notes: list[str] = []
    error = None
    stack = Stack()
    try:
        stack.start()
        asyncio.run(phase_embed(stack, checks, notes))
        asyncio.run(phase_json(stack, checks, notes))
    except Exception as e:  # the run ends with its reason and the summary of what did run
        error = f"{type(e).__name__}: {e}"
        log(f"FAILED: {error}")
    finally:
        stack.close()
    text, ok = summary(checks, notes, error)
    (OUT / "features_summary.txt").write_text(text)
    print(text, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
