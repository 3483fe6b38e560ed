"""The SGLang worker when its engine dies: the worker (real runtime, real nats-server, real sockets) runs
``SglangEngine`` on ``tests.support.sglang_fake.FakeSglangEngine`` with real child processes titled as
SGLang's scheduler and detokenizer (SGLang itself needs a GPU). SIGKILL of the scheduler process ends
the in-flight stream with ``engine_died`` and the engine is restarted in place: the dead engine's parts
in this process are released (its handle-loop task, its bootstrap server), a new engine is built, and
the worker serves again. SGLang's own SIGQUIT handler (which would kill this whole process tree) is
replaced by the worker's after every start, and a SIGQUIT is the engine's death too."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import uuid

import nats
import pytest
from dynamo_worker.protocol import GenerateRequest, StopConditions
from dynamo_worker.runtime.discovery import InstanceWatcher
from dynamo_worker.runtime.recovery import EXIT_ENGINE_DIED
from dynamo_worker.runtime.request_plane import RequestClient
from dynamo_worker.runtime.settings import RuntimeSettings
from dynamo_worker.runtime.worker import Worker
from dynamo_worker.sglang.args import SglangSettings, WorkerPlan
from dynamo_worker.sglang.engine import SglangEngine
from dynamo_worker.sglang.processes import process_name
from dynamo_worker.tinymodel import ensure_tiny_model

from tests.support.sglang_fake import FAKE_BOOTSTRAP_HOST, FakeServerArgs, FakeSglangEngine
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

WAIT_S = 20.0
FAST = SglangSettings(
    canary_interval_s=0.2, canary_timeout_s=2.0, load_interval_s=0.1, capacity_timeout_s=2, warmup_timeout_s=2
)


@pytest.fixture
async def sglang_worker(nats_url, tmp_path):
    workers: list[Worker] = []
    made: list[FakeSglangEngine] = []

    async def make(**runtime) -> tuple[Worker, list[FakeSglangEngine]]:
        model = ensure_tiny_model(tmp_path / "model")
        server_args = FakeServerArgs(model_path=str(model), served_model_name="m")
        settings = RuntimeSettings(
            namespace="sd-" + uuid.uuid4().hex[:8],
            nats_server=nats_url,
            system_port=0,
            request_port=0,
            listen_host="127.0.0.1",
            graceful_shutdown_s=1,
            **runtime,
        )
        plan = WorkerPlan(
            server_args=server_args,
            runtime=settings,
            settings=FAST,
            bootstrap_port_chosen=False,
            bootstrap_host="127.0.0.1",
            fake_bootstrap_host=FAKE_BOOTSTRAP_HOST,
            build_server_args=lambda changes: dataclasses.replace(server_args, **changes),
        )

        def factory(args):
            made.append(FakeSglangEngine(args, token_delay_s=0.01, child_processes=True))
            return made[-1]

        worker = Worker(SglangEngine(plan, engine_factory=factory), settings)
        workers.append(worker)
        await worker.start()
        return worker, made

    yield make
    for worker in workers:
        await worker.shutdown()
    for engine in made:
        engine.shutdown()


def sigquit_is_ours() -> bool:
    handle = asyncio.get_running_loop()._signal_handlers.get(signal.SIGQUIT)  # type: ignore[attr-defined]
    return handle is not None and getattr(handle._callback, "__name__", "") == "_sigquit"


async def test_a_killed_scheduler_hands_back_the_stream_and_the_engine_restarts(sglang_worker, nats_url):
    worker, made = await sglang_worker(on_engine_death="restart")
    assert sigquit_is_ours()
    assert {p.name for p in worker.engine.processes()} == {"scheduler_TP0", "detokenizer"}
    assert worker.record is not None
    nc = await nats.connect(nats_url)
    watcher = await InstanceWatcher(nc, worker.settings.namespace).start()
    request = GenerateRequest(
        request_id="r", model="m", token_ids=list(range(1, 20)), stop=StopConditions(max_tokens=5000)
    )
    try:
        async with RequestClient(first_token_timeout_s=WAIT_S, inter_token_timeout_s=WAIT_S) as client:
            chunks = 0
            async with asyncio.timeout(WAIT_S):
                async for chunk in client.generate(worker.record.address, request):
                    chunks += 1
                    if chunks == 3:
                        os.kill(made[0].child("scheduler_TP0"), signal.SIGKILL)
                    last = chunk
            assert last.error is not None and last.error.type == "engine_died"
            assert "scheduler_TP0" in last.error.message
            await wait_until_async(lambda: len(made) == 2, "a new SGLang engine", timeout_s=WAIT_S)
            first = made[0].tokenizer_manager
            assert made[0].shut_down  # SGLang's shutdown: what is left of its process tree is killed
            assert all(t.done() for t in first.asyncio_tasks)  # its handle loop no longer waits on our loop
            await wait_until_async(
                lambda: worker.system.state == "ready" and worker.settings.instance_id in watcher.instances,
                "the worker to serve again",
                timeout_s=WAIT_S,
            )
            assert sigquit_is_ours() and not made[1].tokenizer_manager.sglang_sigquit_ran
            short = request.model_copy(update={"request_id": "s", "stop": StopConditions(max_tokens=3)})
            answer = [c async for c in client.generate(worker.record.address, short)]
            assert answer[-1].finish_reason == "length"
    finally:
        await watcher.stop()
        await nc.close()


async def test_sigquit_from_sglang_is_the_engines_death_not_the_processs(sglang_worker):
    worker, made = await sglang_worker(on_engine_death="exit")
    assert sigquit_is_ours()  # else the signal below would end pytest itself
    os.kill(os.getpid(), signal.SIGQUIT)  # what a failed scheduler, or SGLang's watchdog, sends
    await wait_until_async(worker.ended.is_set, "the worker to decide to exit", timeout_s=WAIT_S)
    assert worker.exit_code == EXIT_ENGINE_DIED
    assert not made[0].tokenizer_manager.sglang_sigquit_ran


def test_process_names_come_from_sglangs_titles():
    assert process_name("sglang::scheduler_TP0", 7) == "scheduler_TP0"
    assert process_name("sglang::detokenizer", 7) == "detokenizer"
    assert process_name("python -c spawn_main x", 7) == "process_7"
