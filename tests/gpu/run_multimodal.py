"""Multimodal and diffusion proof: images in chat through processor -> encode -> language, and image
generation, through our frontend.

usage: ENGINE=mocker python tests/gpu/run_multimodal.py      (no GPU: validates the script and the path)
       ENGINE=sglang python tests/gpu/run_multimodal.py      (one GPU, SGLang 0.5.17, about 3 minutes)

Each phase serves an example with ``dynamo-run --engine $ENGINE`` (the manifests of ``examples/``, the
way a user runs them) and drives it with the official ``openai`` client:

- ``vlm`` (examples/multimodal-agg.yaml): an image chat request answers; the same image again is an
  embedding-cache hit (the encode worker's ``dynamo_encode_cache_hits_total``) and a KV-cache hit
  (``cached_tokens``); two images in one message count both images' tokens; a broken image is a 400;
  an image chat is served or refused as the same chat without its image (``response_format`` and a
  required tool: the same 400, the example's workers run no grammar backend; ``logprobs``: one per
  token, with the asked alternatives).
- ``diffusion`` (examples/diffusion.yaml): ``n=2`` images as ``b64_json`` are two PNGs of the asked size;
  ``url`` images are files under the worker's ``--media-output-fs-url``.

On SGLang (``ENGINE=sglang``) the ``vlm`` phase first builds a tiny Qwen2-VL-shaped model folder with
real random weights (``mm_model.py``: 2 layers, a 2-block vision tower; a 224 x 224 image is 64 tokens),
asks SGLang's own server (``sglang.launch_server``, the flags of ``SGLANG_FLAGS``) the same image chats
(one image, two images) at temperature 0, stops it, then serves the example with ``--model-dir`` on
that folder: the encode worker (``python -m dynamo_worker.sglang --role encode``: HF's vision tower)
and the language worker (SGLang with our precomputed embeddings) share the one GPU
(``CUDA_VISIBLE_DEVICES=0,0`` makes dynamo-run hand GPU 0 to both), the language worker gets the same
SGLang flags. Our answers must equal SGLang's own, text and token counts.

The ``diffusion`` phase does not run on SGLang: SGLang 0.5.17's diffusion generator
(``sglang.multimodal_gen``, ``DiffGenerator``) loads only registered pipelines (Flux, SD3, Wan,
Qwen-Image, ...) from a diffusers folder (``model_index.json`` with transformer, VAE, text encoders,
tokenizers and scheduler) and has no dummy-weight load format; a tiny random pipeline would need
``diffusers`` (not among the wheels carried to the GPU image) to write it, and the GPU machine has no
hub access for a real one. ``python -m dynamo_worker.sglang --role diffusion`` exits 2 saying so; the
mocker serves the role.

Prints a summary (also ``$OUT/summary.txt``) and exits 1 when a check failed.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("OUT") or "/tmp/dynamo-gpu-out")
ENGINE = os.environ.get("ENGINE", "sglang")
STARTUP_S = float(os.environ.get("STARTUP_S", 300))
WORK = Path(os.environ.get("MM_DIR") or "/tmp/dynamo-gpu-mm")
SGLANG_FLAGS = [
    "--attention-backend", "triton", "--sampling-backend", "pytorch", "--cuda-graph-backend-prefill",
    "disabled", "--cuda-graph-backend-decode", "disabled", "--mm-feature-transport", "cpu",
    "--skip-server-warmup", "--context-length", "4096", "--mem-fraction-static", "0.5", "--max-total-tokens",
    "131072", "--grammar-backend", "none", "--random-seed", "1", "--mm-attention-backend", "triton_attn",
]  # fmt: skip
QUESTION = "What is in the picture?"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stop(proc: subprocess.Popen, terminate: Callable[[], None], grace_s: float) -> None:
    """``terminate`` a running ``proc`` (a session leader), then SIGKILL its group after ``grace_s``."""
    if proc.poll() is not None:
        return
    terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """``dynamo-run EXAMPLE --engine $ENGINE`` until it serves (bounded), its output in $OUT/logs."""

    def __init__(self, example: str | Path, model_dir: Path | None = None, env: dict | None = None) -> None:
        self.port = free_port()
        OUT.joinpath("logs").mkdir(parents=True, exist_ok=True)
        self.log_path = OUT / "logs" / f"{Path(example).stem}.log"
        manifest = example if isinstance(example, Path) else ROOT / "examples" / example
        # python -m: the GPU machine installs the package with --target, so no dynamo-run beside python
        argv = [sys.executable, "-m", "dynamo_worker.local", str(manifest), "--engine", ENGINE]
        argv += ["--port", str(self.port)]
        argv += ["--startup-timeout", str(STARTUP_S), "--log-dir", str(OUT / "logs" / Path(example).stem)]
        argv += ["--model-dir", str(model_dir)] if model_dir else []
        self._out = self.log_path.open("w")
        self.proc = subprocess.Popen(
            argv,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        deadline = time.monotonic() + STARTUP_S + 30
        while "Serving namespace=" not in self.log_path.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()  # never leave a half-started graph behind
                raise RuntimeError(f"dynamo-run {example} did not start; see {self.log_path}")
            time.sleep(0.5)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="x", max_retries=0)

    def worker_metrics(self, name: str) -> float:
        """The sum of ``name`` over the system ports dynamo-run's workers expose."""
        total = 0.0
        for port in set(re.findall(r"system_port=(\d+)", self.log_path.read_text(errors="replace"))):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    found = re.search(rf"^{name} (\S+)$", r.read().decode(), re.M)
            except OSError:
                continue
            total += float(found[1]) if found else 0.0
        return total

    def stop(self) -> None:
        stop(self.proc, lambda: self.proc.send_signal(signal.SIGTERM), grace_s=60)  # dynamo-run stops its own
        self._out.close()


def png(width: int, height: int, shade: int) -> bytes:
    from dynamo_worker.multimodal.images import write_png

    return write_png(width, height, bytes((shade, 90, 200)) * (width * height))


def png_data_url(width: int, height: int, shade: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png(width, height, shade)).decode()


def image_chat(client: openai.OpenAI, model: str, *urls: str, **kw):
    content = [{"type": "text", "text": QUESTION}]
    content += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=8, temperature=0, **kw
    )


def refusal(create: Callable[[], object]) -> dict | None:
    """The 400's error body, or None when the request was served."""
    try:
        create()
    except openai.BadRequestError as e:
        return e.body if isinstance(e.body, dict) else {"message": e.message}
    return None


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
PERSON = {"type": "json_schema", "json_schema": {"name": "person", "schema": {"type": "object"}}}


def feature_checks(client: openai.OpenAI, model: str, url: str) -> dict[str, bool]:
    """An image chat is served or refused as the same chat without its image."""
    checks = {}
    text_only = [{"role": "user", "content": QUESTION}]
    asks = {"response_format": {"response_format": PERSON}, "tool_choice required": {"tools": [WEATHER]}}
    asks["tool_choice required"]["tool_choice"] = "required"
    for name, kw in asks.items():
        text = refusal(
            lambda kw=kw: client.chat.completions.create(model=model, messages=text_only, max_tokens=8, **kw)
        )
        image = refusal(lambda kw=kw: image_chat(client, model, url, **kw))
        code = (text or {}).get("code")
        checks[f"{name}: the image chat gets the text chat's 400 ({code})"] = (
            text is not None and image == text
        )
    reply = image_chat(client, model, url, logprobs=True, top_logprobs=2)
    entries = reply.choices[0].logprobs.content if reply.choices[0].logprobs else None
    got = entries or []
    checks["an image chat with logprobs gets one per token"] = (
        bool(got) and len(got) == reply.usage.completion_tokens and all(len(e.top_logprobs) == 2 for e in got)
    )
    return checks


def answer(reply) -> tuple[str, int, int]:
    """What a greedy reply is compared by: its text and token counts."""
    return reply.choices[0].message.content or "", reply.usage.completion_tokens, reply.usage.prompt_tokens


class Native:
    """SGLang's own server on the tiny model (bounded start), its output in $OUT/logs."""

    def __init__(self, model_dir: Path) -> None:
        self.port = free_port()
        OUT.joinpath("logs").mkdir(parents=True, exist_ok=True)
        self._out = (OUT / "logs" / "sglang-native.log").open("w")
        argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir),
                "--served-model-name", "tiny-vl", "--host", "127.0.0.1", "--port", str(self.port),
                *SGLANG_FLAGS]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + STARTUP_S
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("sglang.launch_server did not start; see $OUT/logs/sglang-native.log")
            time.sleep(1)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="x", max_retries=0)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=3) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        stop(self.proc, lambda: os.killpg(self.proc.pid, signal.SIGTERM), grace_s=30)
        self._out.close()


def sglang_model() -> tuple[Path, Path]:
    """The tiny model folder (built here) and the example's manifest with the GPU proof's SGLang flags."""
    import yaml

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import mm_model

    folder = WORK / "mm-tiny"  # no "qwen" or "vl" in the path: SGLang would pick a built-in chat template
    if not (folder / "model.safetensors").is_file():
        log(f"building the tiny model folder {folder}")
        mm_model.build(folder, png(224, 224, 1), QUESTION)
    graph = yaml.safe_load((ROOT / "examples" / "multimodal-agg.yaml").read_text())
    container = graph["spec"]["services"]["decode"]["extraPodSpec"]["mainContainer"]
    container["args"] = [*container["args"], *SGLANG_FLAGS, "--canary-interval-s", "5"]
    manifest = WORK / "multimodal-agg-gpu.yaml"
    manifest.write_text(yaml.safe_dump(graph))
    return folder, manifest


def native_answers(folder: Path) -> dict[str, tuple[str, int, int]]:
    log("asking SGLang's own server")
    native = Native(folder)
    try:
        return {
            "one image": answer(image_chat(native.client, "tiny-vl", png_data_url(224, 224, 1))),
            "two images": answer(
                image_chat(native.client, "tiny-vl", png_data_url(224, 224, 1), png_data_url(224, 224, 2))
            ),
        }
    finally:
        native.stop()


def phase_vlm(checks: dict[str, bool]) -> None:
    theirs: dict[str, tuple[str, int, int]] = {}
    if ENGINE == "sglang":
        folder, manifest = sglang_model()
        theirs = native_answers(folder)
        for name, value in theirs.items():
            log(f"SGLang's own server, {name}: {value}")
        run = Run(manifest, model_dir=folder, env={"CUDA_VISIBLE_DEVICES": "0,0"})
    else:
        run = Run("multimodal-agg.yaml")
    try:
        model = run.client.models.list().data[0].id
        cat = png_data_url(224, 224, 1)
        first = image_chat(run.client, model, cat)
        again = image_chat(run.client, model, cat)
        checks["image chat answers"] = bool(first.choices[0].message.content)
        checks["repeated image: same greedy output"] = (
            first.choices[0].message.content == again.choices[0].message.content
        )
        checks["repeated image: embedding-cache hit"] = (
            run.worker_metrics("dynamo_encode_cache_hits_total") >= 1
        )
        cached = again.usage.prompt_tokens_details.cached_tokens if again.usage.prompt_tokens_details else 0
        checks["repeated image: KV-cache hit"] = cached >= first.usage.prompt_tokens // 2
        both = image_chat(run.client, model, cat, png_data_url(224, 224, 2))
        checks["two images take both images' tokens"] = both.usage.prompt_tokens > first.usage.prompt_tokens
        ours = {"one image": answer(first), "two images": answer(both)}
        for name, value in theirs.items():
            log(f"ours, {name}: {ours[name]}")
            checks[f"{name}: greedy output equals SGLang's own server ({value[0]!r})"] = ours[name] == value
        try:
            image_chat(run.client, model, "data:image/png;base64,aGVsbG8=")
            checks["a broken image is a 400"] = False
        except openai.BadRequestError as e:
            checks["a broken image is a 400"] = e.code == "invalid_image"
        checks.update(feature_checks(run.client, model, cat))
    finally:
        run.stop()


def phase_diffusion(checks: dict[str, bool]) -> None:
    from dynamo_worker.multimodal.images import sniff

    run = Run("diffusion.yaml")
    try:
        model = run.client.models.list().data[0].id
        images = run.client.images.generate(
            model=model, prompt="a fox", n=2, size="256x128", response_format="b64_json"
        )
        sizes = {
            (sniff(base64.b64decode(d.b64_json)).width, sniff(base64.b64decode(d.b64_json)).height)
            for d in images.data
        }
        checks["n=2 b64_json: two PNGs of the asked size"] = len(images.data) == 2 and sizes == {(256, 128)}
        urls = run.client.images.generate(model=model, prompt="a fox", n=1, size="256x256")
        path = Path(urls.data[0].url.removeprefix("file://"))
        checks["url: the file is stored"] = path.is_file() and sniff(path.read_bytes()).width == 256
    finally:
        run.stop()


def print_log_tails(lines: int = 25) -> None:
    """The end of every process log, so one device call shows why a phase failed."""
    for path in sorted(OUT.joinpath("logs").rglob("*.log")):
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        print(f"----- {path.relative_to(OUT)} (last {len(tail)} lines)", *tail, sep="\n", flush=True)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    checks: dict[str, bool] = {}
    notes = []
    phases = [phase_vlm, phase_diffusion]
    if ENGINE == "sglang":
        phases.remove(phase_diffusion)
        has_diffusers = importlib.util.find_spec("diffusers") is not None
        notes.append(
            "diffusion: not run on SGLang (see this script's docstring: SGLang 0.5.17's DiffGenerator "
            "needs a real diffusers pipeline folder, no dummy weights; diffusers is "
            f"{'installed' if has_diffusers else 'not installed'} here)"
        )
    for phase in phases:
        log(f"phase {phase.__name__}")
        try:
            phase(checks)
        except Exception as e:  # a phase that cannot run is a failed check, reported with its reason
            checks[f"{phase.__name__} ran ({type(e).__name__}: {e})"] = False
            print_log_tails()
    lines = [f"{'PASS' if ok else 'FAIL'}  {name}" for name, ok in checks.items()]
    verdict = "RESULT: PASS" if checks and all(checks.values()) else "RESULT: FAIL"
    summary = "\n".join([f"engine={ENGINE}", *lines, *notes, verdict])
    (OUT / "summary.txt").write_text(summary + "\n")
    print(summary, flush=True)
    return 0 if checks and all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
