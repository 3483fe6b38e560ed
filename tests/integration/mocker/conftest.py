"""Fixtures for mocker integration tests: mocker worker processes on 127.0.0.1 on ports they bind, each
test module in its own Dynamo namespace, every process stopped at teardown."""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from dynamo_worker.protocol import InstanceRecord
from dynamo_worker.runtime.discovery import InstanceWatcher
from dynamo_worker.tinymodel import ensure_tiny_model

from tests.support.procs import listening_port, popen
from tests.support.wait import wait_until_async


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("mocker-tiny") / "model")


@dataclass
class MockerProc:
    proc: subprocess.Popen
    component: str
    log_path: Path
    record: InstanceRecord | None = None

    @functools.cached_property
    def system_port(self) -> int:
        """The port its system server bound (it was given 0), from its log."""
        return listening_port(self.proc, self.log_path, "system")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

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
            self.proc.kill()
            self.proc.wait(10)


class Mockers:
    """Starts mocker processes in one namespace and waits for their registration."""

    def __init__(self, nats_url: str, namespace: str, model_dir: Path, log_dir: Path) -> None:
        self.nats_url = nats_url
        self.namespace = namespace
        self.model_dir = model_dir
        self.log_dir = log_dir
        self.procs: list[MockerProc] = []
        self.nc: nats.NATS | None = None
        self.watcher: InstanceWatcher | None = None

    async def open(self) -> None:
        self.nc = await nats.connect(self.nats_url)
        self.watcher = await InstanceWatcher(self.nc, self.namespace).start()

    def spawn(self, component: str, *args: str) -> MockerProc:
        log_path = self.log_dir / f"{component}-{len(self.procs)}.log"
        cmd = [
            sys.executable, "-m", "dynamo_worker.mocker",
            "--namespace", self.namespace, "--component", component, "--nats-server", self.nats_url,
            "--system-port", "0", "--request-port", "0", "--listen-host", "127.0.0.1",
            "--advertise-host", "127.0.0.1", "--model-dir", str(self.model_dir),
            "--served-model-name", "tiny", "--page-size", "4", *args,
        ]  # fmt: skip
        with open(log_path, "wb") as out:
            proc = popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        mp = MockerProc(proc, component, log_path)
        self.procs.append(mp)
        return mp

    async def registered(self, mp: MockerProc, within_s: float = 30.0) -> InstanceRecord:
        """Wait until ``mp`` registered (it is the only live instance of its component)."""
        watcher = self.watcher
        assert watcher is not None

        def found() -> list[InstanceRecord]:
            records = [r for r in watcher.instances.values() if r.component == mp.component]
            assert records or mp.proc.poll() is None, (
                f"mocker {mp.component} did not register:\n{mp.log()[-3000:]}"
            )
            return records

        what = f"mocker {mp.component} to register"
        records = await wait_until_async(
            found, what, timeout_s=within_s, interval_s=0.02, explain=lambda: mp.log()[-3000:]
        )
        mp.record = records[0]
        return records[0]

    async def close(self) -> None:
        for mp in self.procs:  # all at once: each drains and deregisters in its own time
            mp.terminate()
        for mp in self.procs:
            mp.wait_stopped()
        if self.watcher is not None:
            await self.watcher.stop()
        if self.nc is not None:
            await self.nc.close()


@pytest.fixture
async def mockers(nats_url, tiny_model, tmp_path) -> AsyncIterator[Mockers]:
    m = Mockers(nats_url, "mk-" + uuid.uuid4().hex[:8], tiny_model, tmp_path)
    await m.open()
    yield m
    await m.close()
