"""Multimodal and diffusion proof: images in chat through processor -> encode -> language, and image
generation, through our frontend.

usage: ENGINE=mocker python tests/gpu/run_multimodal.py      (no GPU: validates the script and the path)
       ENGINE=sglang python tests/gpu/run_multimodal.py      (one GPU: see "What blocks ENGINE=sglang")

Each phase serves an example with ``dynamo-run --engine $ENGINE`` (the manifests of ``examples/``, the
way a user runs them) and drives it with the official ``openai`` client:

- ``vlm`` (examples/multimodal-agg.yaml): an image chat request answers; the same image again is an
  embedding-cache hit (the encode worker's ``dynamo_encode_cache_hits_total``) and a KV-cache hit
  (``cached_tokens``); two images in one message count both images' tokens; a broken image is a 400.
- ``diffusion`` (examples/diffusion.yaml): ``n=2`` images as ``b64_json`` are two PNGs of the asked size;
  ``url`` images are files under the worker's ``--media-output-fs-url``.

Prints a summary (also ``$OUT/summary.txt``) and exits 1 when a check failed.

What blocks ENGINE=sglang (exit 3, before any GPU time is spent): the SGLang engines of the encode and
diffusion roles are not built yet (``python -m dynamo_worker.sglang --role encode|diffusion`` exits 2
saying so), and the language worker does not yet hand ``GenerateRequest.images`` to SGLang (SGLang
0.5.17 takes precomputed embeddings as one ``{"format": "precomputed_embedding"}`` item per modality
per request, so several images must be concatenated into one item). The comparison with SGLang's own
server also needs a vision-language model's processor and tokenizer files on the GPU machine, which
has no hub access. Greedy equality against ``sglang.launch_server`` for the same image is the check
to add once those exist.
"""

from __future__ import annotations

import base64
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("OUT") or "/tmp/dynamo-gpu-out")
ENGINE = os.environ.get("ENGINE", "sglang")
STARTUP_S = float(os.environ.get("STARTUP_S", 420))
BLOCKED = 3


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """``dynamo-run EXAMPLE --engine $ENGINE`` until it serves (bounded), its output in $OUT/logs."""

    def __init__(self, example: str) -> None:
        self.port = free_port()
        OUT.joinpath("logs").mkdir(parents=True, exist_ok=True)
        self.log_path = OUT / "logs" / f"{Path(example).stem}.log"
        exe = Path(sys.executable).parent / "dynamo-run"
        argv = [str(exe), str(ROOT / "examples" / example), "--engine", ENGINE, "--port", str(self.port)]
        argv += ["--startup-timeout", str(STARTUP_S)]
        self._out = self.log_path.open("w")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + STARTUP_S + 30
        while "Serving namespace=" not in self.log_path.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
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
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()


def png_data_url(width: int, height: int, shade: int) -> str:
    from dynamo_worker.multimodal.images import write_png

    return (
        "data:image/png;base64,"
        + base64.b64encode(write_png(width, height, bytes((shade, 90, 200)) * (width * height))).decode()
    )


def image_chat(client: openai.OpenAI, model: str, *urls: str, **kw):
    content = [{"type": "text", "text": "What is in the picture?"}]
    content += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=8, temperature=0, **kw
    )


def phase_vlm(checks: dict[str, bool]) -> None:
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
        try:
            image_chat(run.client, model, "data:image/png;base64,aGVsbG8=")
            checks["a broken image is a 400"] = False
        except openai.BadRequestError as e:
            checks["a broken image is a 400"] = e.code == "invalid_image"
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


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    if ENGINE != "mocker":
        log("BLOCKED: the SGLang encode, diffusion and multimodal-language engines are not built yet; see "
            "the docstring of this script. ENGINE=mocker runs the path without a GPU.")  # fmt: skip
        return BLOCKED
    checks: dict[str, bool] = {}
    for phase in (phase_vlm, phase_diffusion):
        log(f"phase {phase.__name__}")
        try:
            phase(checks)
        except Exception as e:  # a phase that cannot run is a failed check, reported with its reason
            checks[f"{phase.__name__} ran ({type(e).__name__}: {e})"] = False
    lines = [f"{'PASS' if ok else 'FAIL'}  {name}" for name, ok in checks.items()]
    summary = f"engine={ENGINE}\n" + "\n".join(lines)
    (OUT / "summary.txt").write_text(summary + "\n")
    print(summary, flush=True)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
