"""The worker lifecycle in-process with a real nats-server and real sockets: /health is 503 until the
engine started and the worker registered, 200 while serving, 503 while draining; a failing engine
health check turns it 503; /metrics is Prometheus text; shutdown deregisters and stops serving.
(The engine is faked where it needs to be slow or fail; everything else is real.)"""

from __future__ import annotations

import asyncio
import uuid

import aiohttp
import nats
import pytest
from dynamo_worker.mocker.engine import MockerEngine
from dynamo_worker.mocker.settings import MockerSettings
from dynamo_worker.protocol import GenerateRequest, StopConditions
from dynamo_worker.runtime.discovery import InstanceWatcher
from dynamo_worker.runtime.engine import NullEventSink
from dynamo_worker.runtime.request_plane import RequestClient, WorkerUnreachable
from dynamo_worker.runtime.settings import RuntimeSettings
from dynamo_worker.runtime.worker import Worker, WorkerStartError, connect_nats, run_worker
from dynamo_worker.tinymodel import ensure_tiny_model

from tests.support.ports import refused_port
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration


class GatedMocker(MockerEngine):
    """A mocker whose start waits for a gate, and whose health can be switched off."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.gate = asyncio.Event()
        self.healthy = True

    async def start(self):
        await self.gate.wait()
        return await super().start()

    async def health_check(self) -> None:
        if not self.healthy:
            raise RuntimeError("simulated engine failure")


async def get(session: aiohttp.ClientSession, port: int, path: str) -> tuple[int, str]:
    async with session.get(f"http://127.0.0.1:{port}{path}") as r:
        return r.status, await r.text()


async def test_health_follows_the_lifecycle(nats_url, tmp_path):
    namespace = "wk-" + uuid.uuid4().hex[:8]
    settings = RuntimeSettings(
        namespace=namespace,
        nats_server=nats_url,
        system_port=0,
        request_port=0,
        listen_host="127.0.0.1",
        graceful_shutdown_s=1,
    )
    engine = GatedMocker(MockerSettings(model_dir=ensure_tiny_model(tmp_path / "m"), speedup=100))
    worker = Worker(engine, settings)
    starting = asyncio.create_task(worker.start())
    async with aiohttp.ClientSession() as session:
        await wait_until_async(lambda: worker.system.port is not None, "the system server port", timeout_s=10)
        port = worker.system.port
        assert (await get(session, port, "/live"))[0] == 200
        status, body = await get(session, port, "/health")
        assert status == 503 and "starting" in body
        engine.gate.set()
        record = await starting
        assert (await get(session, port, "/health"))[0] == 200
        engine.healthy = False
        status, body = await get(session, port, "/health")
        assert status == 503 and "simulated engine failure" in body
        engine.healthy = True
        status, metrics = await get(session, port, "/metrics")
        assert status == 200 and "dynamo_worker_inflight_requests 0.0" in metrics

        nc = await nats.connect(nats_url)
        watcher = await InstanceWatcher(nc, namespace).start()
        assert record.instance_id in watcher.instances
        await worker.shutdown()
        await wait_until_async(
            lambda: record.instance_id not in watcher.instances,
            "the instance to leave discovery",
            timeout_s=10,
        )
        await watcher.stop()
        await nc.close()
    async with RequestClient(connect_timeout_s=1) as client:
        with pytest.raises(WorkerUnreachable):
            req = GenerateRequest(request_id="x", model="m", token_ids=[1], stop=StopConditions(max_tokens=1))
            await anext(client.generate(record.address, req))


async def test_nats_that_never_answers_fails_start_with_a_clear_error():
    with pytest.raises(WorkerStartError, match="could not connect to NATS"):
        await connect_nats(f"nats://127.0.0.1:{refused_port()}", name="t", within_s=1.0)


async def test_a_stop_during_a_slow_engine_start_exits_cleanly(nats_url, tmp_path):
    settings = RuntimeSettings(
        namespace="wk-" + uuid.uuid4().hex[:8],
        nats_server=nats_url,
        system_port=0,
        request_port=0,
        listen_host="127.0.0.1",
    )
    engine = GatedMocker(MockerSettings(model_dir=ensure_tiny_model(tmp_path / "m")))  # gate never opens
    stop = asyncio.Event()
    running = asyncio.create_task(run_worker(engine, settings, stop=stop))
    await wait_until_async(
        lambda: engine._sink is not None and not isinstance(engine._sink, NullEventSink),
        "the engine to get its event sink",
        timeout_s=10,
    )
    stop.set()
    async with asyncio.timeout(10):
        assert await running == 0
    assert engine.stopping  # stop() ran although start() never finished
