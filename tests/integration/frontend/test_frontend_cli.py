"""``python -m dynamo_worker.frontend`` as a process: it finds a mocker through discovery, /health
turns 200 once the model is served, it answers the official ``openai`` client, and SIGTERM ends it
with exit code 0."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import openai
import pytest
from dynamo_worker.runtime.nats_server import free_port

from tests.support.procs import popen

pytestmark = pytest.mark.integration


def health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def test_frontend_process_serves_and_stops(mockers, nats_url, namespace, tmp_path):
    port = free_port()
    log = tmp_path / "frontend.log"
    with open(log, "wb") as out:
        proc = popen(
            [
                sys.executable,
                "-m",
                "dynamo_worker.frontend",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(port),
                "--namespace",
                namespace,
                "--nats-server",
                nats_url,
                "--router-mode",
                "kv",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while health(port) != 503:  # up, nothing served yet
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        m = mockers("null")
        deadline = time.monotonic() + 60
        while health(port) != 200:
            assert proc.poll() is None and m.proc.poll() is None, log.read_text() + m.log()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            assert json.loads(r.read())["models"] == ["tiny"]
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=30)
        r = c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert r.usage.completion_tokens <= 4
        c.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert "Frontend listening" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
