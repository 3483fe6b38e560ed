"""NVIDIA Dynamo's command lines run this project's processes, as in the runtime image: a prefill and a
decode worker started as ``python3 -m dynamo.sglang`` with the arguments of Dynamo's disagg.yaml (on the
mocker, ``DYN_SGLANG_ENGINE=mocker`` as the CPU image sets it) and a frontend started as ``python3 -m
dynamo.frontend`` with Dynamo's frontend flags serve /v1/models and a streamed chat completion; flags our
frontend lacks are named in a warning; SIGTERM to the PID that was started stops the frontend (the
module exec'd in place, so signals reach it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from dynamo_api import contract

from tests.support.procs import listening_port
from tests.support.procs import popen as start_process
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DYNAMO_MODULES = ROOT / "images" / "runtime" / "dynamo-compat"  # what the runtime image installs
MODEL = "Qwen/Qwen3-0.6B"
STARTUP_S = 60.0


def dynamo_sglang_args(mode: str) -> list[str]:
    """The worker arguments of Dynamo's examples/backends/sglang/deploy/disagg.yaml (bootstrap port 0)."""
    return [
        "--model-path", MODEL, "--served-model-name", MODEL, "--page-size", "16", "--tp", "1",
        "--trust-remote-code", "--skip-tokenizer-init", "--disaggregation-mode", mode,
        "--disaggregation-transfer-backend", "nixl", "--disaggregation-bootstrap-port", "0",
        "--host", "0.0.0.0",
    ]  # fmt: skip


def models(port: int) -> list[str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
            return [m["id"] for m in json.loads(r.read())["data"]]
    except (OSError, urllib.error.HTTPError, ValueError, KeyError):
        return []


def test_dynamo_command_lines_serve_disaggregated(nats_url: str, tmp_path: Path):
    namespace = f"dynmods-{os.getpid()}"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "NATS_"))}
    base.update(
        {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(DYNAMO_MODULES), base.get("PYTHONPATH")])),
            # `python3` is the virtualenv's, as /opt/venv/bin leads PATH in the image.
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), base.get("PATH", "")]),
            "TMPDIR": str(tmp_path),
            contract.ENV_NAMESPACE: namespace,
            contract.ENV_NATS_SERVER: nats_url,
            contract.ENV_SGLANG_ENGINE: "mocker",
        }
    )
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}

    def start(name: str, argv: list[str], env: dict[str, str]) -> None:
        logs[name] = tmp_path / f"{name}.log"
        with open(logs[name], "wb") as out:
            procs[name] = start_process(
                argv, stdout=out, stderr=subprocess.STDOUT, env={**base, **env}, start_new_session=True
            )

    def output() -> str:
        return "\n".join(f"--- {n}\n{p.read_text(errors='replace')}" for n, p in logs.items())

    # What the operator puts on a worker pod (the env contract), with the command Dynamo's manifest says.
    for mode in ("prefill", "decode"):
        worker_env = {
            contract.ENV_COMPONENT: mode,
            contract.ENV_SYSTEM_PORT: "0",
            contract.ENV_REQUEST_PORT: "0",
            contract.ENV_LISTEN_HOST: "127.0.0.1",
            contract.ENV_ADVERTISE_HOST: "127.0.0.1",
        }
        start(mode, ["python3", "-m", "dynamo.sglang", *dynamo_sglang_args(mode)], worker_env)
    frontend_argv = [
        "python3", "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", "0",
        "--router-mode", "kv", "--router-kv-overlap-score-weight", "1.0", "--kv-cache-block-size", "16",
        "--router-temperature", "0.0",
    ]  # fmt: skip
    start("frontend", frontend_argv, {})
    try:
        port = listening_port(procs["frontend"], logs["frontend"], "frontend", timeout_s=STARTUP_S)

        def listed() -> bool:
            if MODEL in models(port):
                return True
            exited = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
            assert not exited, f"exited {exited}:\n{output()}"
            return False

        wait_until(listed, f"{MODEL} in /v1/models", timeout_s=STARTUP_S, interval_s=0.2, explain=output)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=30)
        with client:
            stream = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Hello!"}],
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
            )
            text, usage = "", None
            for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                elif chunk.usage:
                    usage = chunk.usage
        assert text, output()
        assert usage is not None and usage.completion_tokens == 8 and usage.prompt_tokens > 0
        log = output()
        assert "Running -m dynamo_worker.mocker in place of -m dynamo.sglang" in log
        assert "Running -m dynamo_worker.frontend in place of -m dynamo.frontend" in log
        assert (
            "Ignored arguments this frontend does not use "
            "args=--kv-cache-block-size 16 --router-temperature 0.0" in log
        )
        procs["frontend"].send_signal(signal.SIGTERM)
        assert procs["frontend"].wait(30) == 0, output()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def test_dynamo_planner_runs_our_planner_with_dynamo_config(tmp_path: Path):
    """Dynamo's disagg_planner example starts ``python3 -m dynamo.planner --config JSON``: the image runs
    our planner in its place, which reads that JSON (a backend it cannot plan for is refused, exit 2)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "NATS_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(DYNAMO_MODULES), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update({contract.ENV_GRAPH_NAME: "g", contract.ENV_GRAPH_NAMESPACE: "ns"})

    def planner(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["python3", "-m", "dynamo.planner", *args], capture_output=True, text=True, env=env, timeout=60
        )

    shown = planner("--help")
    assert shown.returncode == 0, shown.stderr
    assert "usage: python -m dynamo_worker.planner" in shown.stdout
    assert "Running -m dynamo_worker.planner in place of -m dynamo.planner" in shown.stderr
    refused = planner("--config", json.dumps({"environment": "kubernetes", "backend": "vllm"}))
    assert refused.returncode == 2
    assert "--config backend='vllm' is not supported here; use one of sglang, mocker" in refused.stderr


def test_our_sglang_module_runs_the_engine_the_image_names():
    """``python3 -m dynamo_worker.sglang`` (what our examples run) under the CPU image's
    ``DYN_SGLANG_ENGINE=mocker`` runs the mocker, as ``dynamo.sglang`` does: the CPU image serves our
    examples too. A value that is no engine is refused, naming the choices."""
    env = {**os.environ, contract.ENV_SGLANG_ENGINE: "mocker"}
    r = subprocess.run([sys.executable, "-m", "dynamo_worker.sglang", "--help"], env=env, capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0 and "dynamo_worker.mocker" in r.stdout + r.stderr
    env[contract.ENV_SGLANG_ENGINE] = "vllm"
    r = subprocess.run([sys.executable, "-m", "dynamo_worker.sglang", "--help"], env=env, capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "DYN_SGLANG_ENGINE='vllm' is not an engine" in r.stderr
