"""Engine death as a worker event, in-process with a real nats-server and real sockets: the mocker engine
runs its real scheduler child process, and the test SIGKILLs it (what an OOM kill does to SGLang's
scheduler). The worker notices, ends the in-flight stream with ``engine_died``, deregisters, and then
restarts the engine in place (serving again under the same instance id, with a new scheduler process) or
exits with ``EXIT_ENGINE_DIED``; past ``--engine-restart-limit`` deaths in the window it exits (crash
loop). ``ProcessWatch`` describes how a real child ended without reaping it."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import uuid

import aiohttp
import nats
import pytest
from dynamo_worker.mocker.engine import MockerEngine
from dynamo_worker.mocker.settings import MockerSettings
from dynamo_worker.protocol import GenerateChunk, GenerateRequest, StopConditions
from dynamo_worker.runtime.discovery import InstanceWatcher
from dynamo_worker.runtime.engine import EngineProcess
from dynamo_worker.runtime.process_watch import ProcessWatch
from dynamo_worker.runtime.recovery import EXIT_ENGINE_DIED
from dynamo_worker.runtime.request_plane import RequestClient, WorkerRejected
from dynamo_worker.runtime.settings import RuntimeSettings
from dynamo_worker.runtime.worker import Worker
from dynamo_worker.tinymodel import ensure_tiny_model

from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

WAIT_S = 20.0


def long_request(rid: str) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid, model="tiny", token_ids=list(range(5, 40)), stop=StopConditions(max_tokens=5000)
    )


class Served:
    """A worker on a mocker engine with its scheduler process, its discovery watcher, a request client."""

    def __init__(self, worker: Worker, watcher: InstanceWatcher, nc: nats.NATS) -> None:
        self.worker, self.watcher, self.nc = worker, watcher, nc
        self.client = RequestClient(
            connect_timeout_s=2, first_token_timeout_s=WAIT_S, inter_token_timeout_s=WAIT_S
        )

    @property
    def engine(self) -> MockerEngine:
        assert isinstance(self.worker.engine, MockerEngine)
        return self.worker.engine

    def scheduler_pid(self) -> int:
        (process,) = self.engine.processes()
        return process.pid

    async def health(self) -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{self.worker.system.port}/health") as r,
        ):
            return r.status, await r.text()

    async def metrics(self) -> str:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{self.worker.system.port}/metrics") as r,
        ):
            return await r.text()


@pytest.fixture
async def serve(nats_url, tmp_path):
    started: list[Served] = []
    model = ensure_tiny_model(tmp_path / "m")

    async def make(**runtime) -> Served:
        namespace = "ed-" + uuid.uuid4().hex[:8]
        settings = RuntimeSettings(
            namespace=namespace,
            nats_server=nats_url,
            system_port=0,
            request_port=0,
            listen_host="127.0.0.1",
            graceful_shutdown_s=1,
            **runtime,
        )
        engine = MockerEngine(
            MockerSettings(model_dir=model, served_model_name="tiny", speedup=1.0, page_size=4),
            scheduler_process=True,
        )
        worker = Worker(engine, settings)
        await worker.start()
        nc = await nats.connect(nats_url)
        watcher = await InstanceWatcher(nc, namespace).start()
        served = Served(worker, watcher, nc)
        started.append(served)
        return served

    yield make
    for s in started:
        await s.client.close()
        await s.worker.shutdown()
        await s.watcher.stop()
        await s.nc.close()


async def stream_until_killed(served: Served, rid: str) -> tuple[int, GenerateChunk]:
    """Stream a long request; after its third chunk SIGKILL the engine's scheduler process. Returns the
    tokens received and the chunk that ended the stream."""
    assert served.worker.record is not None
    tokens, chunks = 0, 0
    async with asyncio.timeout(WAIT_S):
        async for chunk in served.client.generate(served.worker.record.address, long_request(rid)):
            tokens += len(chunk.token_ids)
            chunks += 1
            if chunk.finish_reason is not None:
                return tokens, chunk
            if chunks == 3:
                os.kill(served.scheduler_pid(), signal.SIGKILL)
    raise AssertionError("the stream ended without a final chunk")


async def test_engine_death_ends_streams_with_engine_died_deregisters_and_exits(serve):
    served = await serve(on_engine_death="exit")
    instance = served.worker.settings.instance_id
    assert instance in served.watcher.instances
    tokens, last = await stream_until_killed(served, "a")
    assert tokens >= 3 and last.finish_reason == "error"
    assert last.error is not None and last.error.type == "engine_died"
    assert "scheduler" in last.error.message and "SIGKILL" in last.error.message
    await wait_until_async(
        lambda: instance not in served.watcher.instances, "the worker to leave discovery", timeout_s=WAIT_S
    )
    await wait_until_async(served.worker.ended.is_set, "the worker to decide to exit", timeout_s=WAIT_S)
    assert served.worker.exit_code == EXIT_ENGINE_DIED
    assert 'dynamo_worker_engine_deaths_total{action="exit"} 1.0' in await served.metrics()
    # until the process exits, requests that still reach it are refused as engine_died (the frontend
    # retries those elsewhere), and /health says why
    with pytest.raises(WorkerRejected) as refused:
        await anext(served.client.generate(served.worker.record.address, long_request("b")))
    assert refused.value.error_type == "engine_died"
    status, body = await served.health()
    assert status == 503 and "engine died" in body


async def test_engine_death_restarts_the_engine_in_place_and_serves_again(serve):
    served = await serve(on_engine_death="restart")
    instance = served.worker.settings.instance_id
    before = served.scheduler_pid()
    removed = asyncio.Event()

    async def watch_removal() -> None:
        async for event in served.watcher.events():
            if type(event).__name__ == "InstanceRemoved" and event.instance_id == instance:
                removed.set()
                return

    watching = asyncio.create_task(watch_removal())
    _, last = await stream_until_killed(served, "a")
    assert last.error is not None and last.error.type == "engine_died"
    async with asyncio.timeout(WAIT_S):
        await removed.wait()  # deregistered: no new traffic while the engine restarts
    await watching

    async def serving_again() -> bool:
        return instance in served.watcher.instances and (await served.health())[0] == 200

    await wait_until_async(serving_again, "the worker to register again", timeout_s=WAIT_S)
    assert served.scheduler_pid() != before  # a new engine, with a new scheduler process
    assert not served.worker.ended.is_set()
    request = long_request("c").model_copy(update={"stop": StopConditions(max_tokens=5)})
    chunks = [c async for c in served.client.generate(served.worker.record.address, request)]
    assert chunks[-1].finish_reason == "length" and sum(len(c.token_ids) for c in chunks) == 5
    assert 'dynamo_worker_engine_deaths_total{action="restart"} 1.0' in await served.metrics()


async def test_a_crash_loop_exits_instead_of_restarting_again(serve, caplog):
    caplog.set_level(logging.ERROR, logger="dynamo_worker.runtime.worker")
    served = await serve(on_engine_death="restart", engine_restart_limit=1, engine_restart_window_s=600)
    first = served.scheduler_pid()
    os.kill(first, signal.SIGKILL)
    await wait_until_async(
        lambda: (
            served.worker.system.state == "ready" and [p for p in served.engine.processes() if p.pid != first]
        ),
        "the first restart",
        timeout_s=WAIT_S,
    )
    assert not served.worker.ended.is_set()
    os.kill(served.scheduler_pid(), signal.SIGKILL)
    await wait_until_async(served.worker.ended.is_set, "the worker to give up", timeout_s=WAIT_S)
    assert served.worker.exit_code == EXIT_ENGINE_DIED
    assert "more than --engine-restart-limit 1: a crash loop" in caplog.text


async def test_process_watch_says_how_a_child_ended_without_reaping_it():
    loop = asyncio.get_running_loop()
    for argv, sig, expected in (
        ([sys.executable, "-c", "import time; time.sleep(60)"], signal.SIGKILL, "signal SIGKILL"),
        ([sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"], None, "exit code 3"),
    ):
        proc = await asyncio.to_thread(subprocess.Popen, argv, stdin=subprocess.PIPE)
        assert proc.stdin is not None
        ended: asyncio.Future[str] = loop.create_future()
        watch = ProcessWatch()
        watch.watch([EngineProcess("child", proc.pid)], lambda p, how, ended=ended: ended.set_result(how))
        if sig is not None:
            proc.send_signal(sig)
        proc.stdin.close()
        async with asyncio.timeout(WAIT_S):
            assert await ended == expected
        assert not watch.watching
        # still waitable by its parent: the watch did not reap it
        assert proc.wait(5) == (-sig if sig is not None else 3)
