"""Inside a freshly built runtime image (hack/build-runtime-image.sh runs it with ``buildah run``): serve a
disaggregated graph two ways and answer a streamed chat completion each time; exit 1 when anything
fails, with the processes' logs.

1. ``dynamo-run MANIFEST --engine mocker``: the embedded NATS, the frontend, a prefill and a decode worker.
2. NVIDIA Dynamo's command lines, as a Dynamo manifest's pods run them with only their images changed:
   ``python3 -m dynamo.sglang`` (the arguments of Dynamo's disagg.yaml) for prefill and decode, on the
   mocker (``DYN_SGLANG_ENGINE=mocker``), and ``python3 -m dynamo.frontend`` with Dynamo's frontend
   flags, all through the image's ``dynamo`` modules.
3. cuda flavour only: SGLang, torch and NIXL import, and ``python3 -m dynamo.sglang --help`` lists
   SGLang's own flags (the real worker; no GPU is needed for that).

Standard library and the image's own packages only; every wait is bounded; servers on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from dynamo_worker.runtime.nats_server import NatsServer, free_port

MODEL = "Qwen/Qwen3-0.6B"  # the served name in examples/disagg.yaml and Dynamo's disagg.yaml
STARTUP_S = 180.0
STOP_S = 40.0


class CheckFailed(Exception):
    pass


def say(message: str) -> None:
    print(f"check-runtime-image: {message}", flush=True)


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def chat(port: int) -> tuple[str, dict]:
    """A streamed chat completion; the text and the usage of the final chunk."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hello!"}],
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    text, usage, done = "", {}, False
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    raise CheckFailed(f"the stream carried an error: {chunk['error']}")
                for choice in chunk.get("choices") or []:
                    text += (choice.get("delta") or {}).get("content") or ""
                usage = chunk.get("usage") or usage
    except urllib.error.HTTPError as e:
        raise CheckFailed(f"POST /v1/chat/completions answered {e.code}: {e.read()[:500]!r}") from None
    if not done or not text or usage.get("completion_tokens") != 8:
        raise CheckFailed(f"incomplete chat completion: done={done} text={text!r} usage={usage}")
    return text, usage


class Processes:
    """Started processes with one log file each; all stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        with open(self.log_dir / f"{name}.log", "wb") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True
            )
        self.procs[name] = proc
        return proc

    def exited(self) -> dict[str, int]:
        return {name: p.returncode for name, p in self.procs.items() if p.poll() is not None}

    def logs(self) -> str:
        return "\n".join(
            f"--- {name} (last 40 lines)\n"
            + "\n".join((self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-40:])
            for name in self.procs
        )

    def wait_until(self, what: str, ready) -> None:
        deadline = time.monotonic() + STARTUP_S
        while not ready():
            if self.exited():
                raise CheckFailed(f"exited before {what}: {self.exited()}")
            if time.monotonic() > deadline:
                raise CheckFailed(f"no {what} within {STARTUP_S:.0f}s")
            time.sleep(0.25)

    def stop(self, name: str) -> int:
        proc = self.procs[name]
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"{name} did not stop within {STOP_S:.0f}s of SIGTERM") from None

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def check_dynamo_run(manifest: Path, procs: Processes) -> None:
    port = free_port()
    procs.start(
        "dynamo-run",
        ["dynamo-run", str(manifest), "--engine", "mocker", "--port", str(port), "--grace-period", "5"],
        {},
    )
    procs.wait_until(
        f"200 on /health of :{port}", lambda: http_get(f"http://127.0.0.1:{port}/health")[0] == 200
    )
    text, usage = chat(port)
    say(f"dynamo-run {manifest.name}: answered {text!r} ({usage})")
    code = procs.stop("dynamo-run")
    if code != 0:
        raise CheckFailed(f"dynamo-run exited {code} on SIGTERM")


def dynamo_sglang_args(mode: str, bootstrap_port: int) -> list[str]:
    """The worker arguments of Dynamo's examples/backends/sglang/deploy/disagg.yaml (bootstrap port free)."""
    return [
        "--model-path", MODEL, "--served-model-name", MODEL, "--page-size", "16", "--tp", "1",
        "--trust-remote-code", "--skip-tokenizer-init", "--disaggregation-mode", mode,
        "--disaggregation-transfer-backend", "nixl", "--disaggregation-bootstrap-port", str(bootstrap_port),
        "--host", "0.0.0.0",
    ]  # fmt: skip


def check_dynamo_modules(procs: Processes) -> None:
    with NatsServer() as nats:
        common = {
            "DYN_NAMESPACE": "image-check",
            "NATS_SERVER": nats.url,
            "DYN_SGLANG_ENGINE": "mocker",  # the CPU image's default; the cuda image has no GPU here
        }
        for mode in ("prefill", "decode"):
            env = {
                **common,
                "DYN_COMPONENT": mode,
                "DYN_SYSTEM_PORT": str(free_port()),
                "DYN_REQUEST_PORT": "0",
                "DYN_LISTEN_HOST": "127.0.0.1",
                "DYN_ADVERTISE_HOST": "127.0.0.1",
            }
            procs.start(mode, ["python3", "-m", "dynamo.sglang", *dynamo_sglang_args(mode, free_port())], env)
        port = free_port()
        frontend = [
            "python3", "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
            "--router-mode", "kv", "--router-kv-overlap-score-weight", "1.0", "--kv-cache-block-size", "16",
        ]  # fmt: skip
        procs.start("frontend", frontend, common)

        def serves_model() -> bool:
            status, body = http_get(f"http://127.0.0.1:{port}/v1/models")
            return status == 200 and MODEL in [m.get("id") for m in json.loads(body).get("data", [])]

        procs.wait_until(f"{MODEL} in /v1/models of :{port}", serves_model)
        text, usage = chat(port)
        say(f"python3 -m dynamo.frontend + 2 x python3 -m dynamo.sglang: answered {text!r} ({usage})")
        procs.close()


def check_cuda_packages() -> None:
    versions = subprocess.run(
        [sys.executable, "-c", "import sglang, torch, nixl; print(sglang.__version__, torch.__version__)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if versions.returncode != 0:
        raise CheckFailed(f"import sglang, torch, nixl failed:\n{versions.stderr[-3000:]}")
    say(f"sglang, torch: {versions.stdout.strip()}")
    helped = subprocess.run(
        ["python3", "-m", "dynamo.sglang", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DYN_SGLANG_ENGINE": "sglang"},
    )
    if helped.returncode != 0 or "--disaggregation-mode" not in helped.stdout:
        raise CheckFailed(
            f"python3 -m dynamo.sglang --help did not list SGLang's flags:\n{helped.stderr[-3000:]}"
        )
    say("python3 -m dynamo.sglang --help lists SGLang's server flags")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flavour", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("manifest", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="image-check-") as tmp:
        for name, check in (
            ("dynamo-run", lambda procs: check_dynamo_run(args.manifest, procs)),
            ("Dynamo command lines", check_dynamo_modules),
        ):
            log_dir = Path(tmp) / name.replace(" ", "-")
            log_dir.mkdir()
            procs = Processes(log_dir)
            try:
                check(procs)
            except (CheckFailed, OSError, ValueError) as e:
                say(f"FAILED {name}: {e}\n{procs.logs()}")
                return 1
            finally:
                procs.close()
        if args.flavour == "cuda":
            try:
                check_cuda_packages()
            except (CheckFailed, subprocess.TimeoutExpired) as e:
                say(f"FAILED cuda packages: {e}")
                return 1
    say("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
