"""``python -m dynamo_worker.frontend`` as a process: it finds a mocker through discovery, /health
turns 200 once the model is served, it answers the official ``openai`` client, and SIGTERM ends it
with exit code 0; with ``--http-workers`` its serving processes share the port and live and die
with it, even when it is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from tests.support.procs import listening_port, popen
from tests.support.procs import popen as start_process
from tests.support.wait import wait_until

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
                "0",
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
        port = listening_port(proc, log, "frontend", timeout_s=30)

        def up() -> bool:  # up, nothing served yet
            assert proc.poll() is None, log.read_text()
            return health(port) == 503

        wait_until(up, "/health to answer 503", timeout_s=30, interval_s=0.1, explain=log.read_text)
        m = mockers("null")

        def served() -> bool:
            assert proc.poll() is None and m.proc.poll() is None, log.read_text() + m.log()
            return health(port) == 200

        wait_until(served, "/health to answer 200", timeout_s=60, interval_s=0.1, explain=log.read_text)
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
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            proc.wait(10)


def _start(nats_url: str, namespace: str, log, *extra: str) -> subprocess.Popen:
    args = ["--http-host", "127.0.0.1", "--http-port", "0", "--namespace", namespace]
    return start_process(
        [sys.executable, "-m", "dynamo_worker.frontend", *args, "--nats-server", nats_url, *extra],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _serving(proc: subprocess.Popen, port: int, log: Path, within_s: float = 60) -> None:
    """Until both processes listen and 20 health checks in a row (new connections, spread over the
    processes) say 200."""

    def serving() -> bool:
        assert proc.poll() is None, log.read_text()
        listening = log.read_text().count("frontend: listening on") >= 2
        return listening and all(health(port) == 200 for _ in range(20))

    wait_until(serving, "both serving processes", timeout_s=within_s, interval_s=0.1, explain=log.read_text)


def test_http_workers_serve_one_port_and_stop_together(mockers, nats_url, namespace, tmp_path):
    """``--http-workers 2``: a second serving process on the same port, answering clients; SIGTERM to
    the frontend stops both, exit code 0."""
    log = tmp_path / "frontend.log"
    mockers("null")
    with open(log, "wb") as out:
        proc = _start(nats_url, namespace, out, "--http-workers", "2")
    try:
        port = listening_port(proc, log, "frontend")
        _serving(proc, port, log)
        helpers = _children(proc.pid)
        assert len(helpers) == 1, log.read_text()
        for _ in range(6):  # a new client (connection) each time
            with openai.OpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=30
            ) as c:
                r = c.completions.create(model="tiny", prompt="hello", max_tokens=3)
                assert r.usage.completion_tokens <= 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        wait_until(
            lambda: not Path(f"/proc/{helpers[0]}").exists(),
            "the serving process to end with the frontend",
            timeout_s=10,
            interval_s=0.1,
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serving_processes_die_with_a_killed_frontend(mockers, nats_url, namespace, tmp_path):
    """A SIGKILLed frontend (no shutdown of its own runs) leaves no serving process behind: each gets
    SIGTERM from the kernel (``runtime.children.die_with_parent``) and ends."""
    log = tmp_path / "frontend.log"
    mockers("null")
    with open(log, "wb") as out:
        proc = _start(nats_url, namespace, out, "--http-workers", "2")
    helper = 0
    try:
        port = listening_port(proc, log, "frontend")
        _serving(proc, port, log)
        (helper,) = _children(proc.pid)
        proc.kill()
        proc.wait(10)
        wait_until(
            lambda: _state(helper) in ("gone", "Z"),
            "the serving process to end with the killed frontend",
            timeout_s=30,
            interval_s=0.1,
            explain=log.read_text,
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if helper and _state(helper) not in ("gone", "Z"):  # the mechanism failed: leave no orphan
            os.kill(helper, signal.SIGKILL)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def test_frontend_exits_when_a_serving_process_dies(mockers, nats_url, namespace, tmp_path):
    """A serving process that dies takes the frontend down (exit code 1) so that it is restarted,
    instead of serving on with part of its processes gone."""
    log = tmp_path / "frontend.log"
    mockers("null")
    with open(log, "wb") as out:
        proc = _start(nats_url, namespace, out, "--http-workers", "2")
    try:
        port = listening_port(proc, log, "frontend")
        _serving(proc, port, log)
        (helper,) = _children(proc.pid)
        os.kill(helper, signal.SIGKILL)
        assert proc.wait(30) == 1
        assert "exited with -9" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_busy_http_port_ends_the_frontend_with_an_error_naming_the_flag(nats_url, namespace):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cmd = [
            sys.executable, "-m", "dynamo_worker.frontend", "--http-host", "127.0.0.1",
            "--http-port", str(port), "--namespace", namespace, "--nats-server", nats_url,
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert f"the frontend cannot listen on 127.0.0.1:{port}: the port is in use" in said
    assert "pass another --http-port, or --http-port 0 for any free port" in said
    assert "Traceback" not in said
