"""Fixtures for frontend integration tests: the tiny model, mocker worker processes, and an in-process
frontend, all on 127.0.0.1 on ports they bind, each test in its own Dynamo namespace."""

from __future__ import annotations

import asyncio
import functools
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dynamo_worker.frontend.app import Frontend
from dynamo_worker.frontend.settings import FrontendSettings
from dynamo_worker.tinymodel import ensure_tiny_model

from tests.support.procs import listening_port, popen

MODEL = "tiny"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("tiny-model") / "model")


@pytest.fixture
def namespace() -> str:
    return "fe-" + uuid.uuid4().hex[:10]


@dataclass
class Mocker:
    proc: subprocess.Popen
    log_path: Path
    args: list[str] = field(default_factory=list)

    @functools.cached_property
    def system_port(self) -> int:
        """The port its system server bound (it was given 0), from its log."""
        return listening_port(self.proc, self.log_path, "system")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def instance_id(self) -> str:
        """Its discovery instance id, from its "Worker ready" log line (it is ready by then)."""
        found = re.search(r"Worker ready instance_id=(\w+)", self.log())
        assert found, f"worker not ready yet:\n{self.log()[-2000:]}"
        return found[1]

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.system_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        self.terminate()
        self.wait_stopped()

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self) -> None:
        """After ``terminate``: its graceful exit, or SIGKILL after 15 s."""
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()


@pytest.fixture
def mockers(nats_url, namespace, tiny_model, tmp_path) -> Iterator:
    """``start(mode="agg", speedup=..., *extra)`` starts a mocker worker process in this namespace."""
    started: list[Mocker] = []

    def start(mode: str = "null", *extra: str, speedup: float = 50.0, component: str | None = None) -> Mocker:
        log_path = tmp_path / f"mocker-{len(started)}.log"
        args = [
            sys.executable,
            "-m",
            "dynamo_worker.mocker",
            "--model-path",
            str(tiny_model),
            "--served-model-name",
            MODEL,
            "--page-size",
            "4",
            "--disaggregation-mode",
            mode,
            "--speedup",
            str(speedup),
            "--namespace",
            namespace,
            "--component",
            component or ("backend" if mode == "null" else mode),
            "--nats-server",
            nats_url,
            "--system-port",
            "0",
            "--request-port",
            "0",
            "--listen-host",
            "127.0.0.1",
            "--advertise-host",
            "127.0.0.1",
            "--graceful-shutdown-s",
            "1",
        ]
        if mode == "prefill":
            args += ["--disaggregation-bootstrap-port", "0"]
        args += list(extra)
        with open(log_path, "wb") as out:
            proc = popen(args, stdout=out, stderr=subprocess.STDOUT)
        m = Mocker(proc, log_path, args)
        started.append(m)
        return m

    yield start
    for m in started:  # all at once: each drains and deregisters in its own time
        m.terminate()
    for m in started:
        m.wait_stopped()


@pytest.fixture
async def frontend_factory(nats_url, namespace) -> AsyncIterator:
    frontends: list[Frontend] = []

    async def make(**overrides) -> Frontend:
        values = {
            "http_host": "127.0.0.1",
            "http_port": 0,
            "namespace": namespace,
            "nats_server": nats_url,
            "connect_timeout_s": 2.0,
            "first_token_timeout_s": 20.0,
            "inter_token_timeout_s": 10.0,
        }
        values.update(overrides)
        fe = await Frontend(FrontendSettings(**values)).start()
        frontends.append(fe)
        return fe

    yield make
    for fe in frontends:
        await fe.stop(drain_s=2)


async def _wait_workers(
    fe: Frontend, count: int, model: str = MODEL, mockers: list | None = None, within_s: float = 60.0
) -> None:
    """Wait until the frontend serves ``model`` with ``count`` workers (failing early if a mocker dies)."""
    deadline = time.monotonic() + within_s
    assert fe.registry is not None
    while True:
        entry = fe.registry.get(model)
        if entry is not None and len(entry.workers) >= count and entry.preprocessor is not None:
            return
        for m in mockers or []:
            if m.proc.poll() is not None:
                raise AssertionError(f"mocker exited with {m.proc.returncode}:\n{m.log()[-3000:]}")
        if time.monotonic() > deadline:
            logs = "\n".join(m.log()[-2000:] for m in mockers or [])
            raise AssertionError(f"frontend did not see {count} workers of {model} in {within_s}s\n{logs}")
        try:
            async with asyncio.timeout(0.2):
                await fe.registry.wait_changed()
        except TimeoutError:
            pass


@pytest.fixture
def wait_workers():
    """``await wait_workers(frontend, count, mockers=[...])``: until the model is served by ``count``."""
    return _wait_workers


async def _wait_warm(fe: Frontend, count: int, within_s: float = 30.0) -> None:
    """Wait until the frontend's warm-ups (``serving.warmup``) made ``count`` prefill/decode pairs warm;
    each warm-up is one request that both workers of its pair count."""
    from tests.support.wait import wait_until_async

    assert fe.warmer is not None
    warmer = fe.warmer
    await wait_until_async(
        lambda: warmer.warm_count() >= count,
        f"{count} warm prefill/decode pair(s)",
        timeout_s=within_s,
        interval_s=0.02,
        explain=lambda: f"warm: {warmer.warm_count()}",
    )


@pytest.fixture
def wait_warm():
    """``await wait_warm(frontend, count)``: until ``count`` prefill/decode pairs are warm."""
    return _wait_warm
