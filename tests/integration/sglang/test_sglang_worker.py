"""The SGLang worker end to end without a GPU: ``run_worker`` serving ``SglangEngine`` registers in
discovery (page size, KV blocks, bootstrap address), serves the real request plane, and the real
frontend serves it to the official ``openai`` client, aggregated and disaggregated (prefill + decode).

SGLang needs a GPU, which this machine lacks: ``SglangEngine`` runs on
``tests.support.sglang_fake.FakeSglangEngine`` (SGLang 0.5.17's ``async_generate`` signature and
output shapes, a deterministic model, and the prefill/decode rendezvous on ``bootstrap_room``).
Everything else is real: nats-server, discovery, the request plane, the frontend, the HTTP client.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

import openai
import pytest
from dynamo_worker.frontend.app import Frontend
from dynamo_worker.frontend.settings import FrontendSettings
from dynamo_worker.protocol import GenerateRequest, StopConditions
from dynamo_worker.runtime.discovery import InstanceWatcher
from dynamo_worker.runtime.request_plane import RequestClient
from dynamo_worker.runtime.settings import RuntimeSettings
from dynamo_worker.runtime.worker import connect_nats, run_worker
from dynamo_worker.sglang.args import SglangSettings, WorkerPlan
from dynamo_worker.sglang.engine import SglangEngine
from dynamo_worker.tinymodel import ensure_tiny_model

from tests.support.sglang_fake import FAKE_BOOTSTRAP_HOST, FakeServerArgs, FakeSglangEngine, eventually

pytestmark = pytest.mark.integration

MODEL = "tiny-sglang"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def namespace() -> str:
    return "sg-" + uuid.uuid4().hex[:10]


class Fleet:
    """SGLang workers (``run_worker`` tasks in this loop) of one namespace, sharing one KV "transfer"."""

    def __init__(self, nats_url: str, namespace: str, model_dir: Path) -> None:
        self.nats_url, self.namespace, self.model_dir = nats_url, namespace, model_dir
        self.rooms: dict[int, asyncio.Event] = {}
        self.fakes: dict[str, FakeSglangEngine] = {}
        self._running: list[tuple[asyncio.Event, asyncio.Task]] = []

    def start(self, mode: str, **fake_kw) -> asyncio.Task:
        role = {"null": "agg", "prefill": "prefill", "decode": "decode"}[mode]

        def factory(server_args):
            fake = FakeSglangEngine(server_args, **fake_kw)
            fake._finished_rooms = self.rooms
            self.fakes[role] = fake
            return fake

        plan = WorkerPlan(
            server_args=FakeServerArgs(
                model_path=str(self.model_dir), served_model_name=MODEL, disaggregation_mode=mode, page_size=4
            ),
            runtime=RuntimeSettings(
                namespace=self.namespace,
                component=role,
                nats_server=self.nats_url,
                system_port=0,
                request_port=0,
                listen_host="127.0.0.1",
                advertise_host="127.0.0.1",
                graceful_shutdown_s=1,
            ),
            settings=SglangSettings(canary_interval_s=0.2),
            bootstrap_host="127.0.0.1",
            fake_bootstrap_host=FAKE_BOOTSTRAP_HOST,
        )
        stop = asyncio.Event()
        task = asyncio.create_task(
            run_worker(SglangEngine(plan, engine_factory=factory), plan.runtime, stop=stop)
        )
        self._running.append((stop, task))
        return task

    async def stop(self) -> None:
        for stop, _ in self._running:
            stop.set()
        for _, task in self._running:
            async with asyncio.timeout(30):
                assert await task == 0


@pytest.fixture
async def fleet(nats_url, namespace, tiny_model):
    f = Fleet(nats_url, namespace, tiny_model)
    yield f
    await f.stop()


async def records(nats_url: str, namespace: str, count: int) -> dict:
    nc = await connect_nats(nats_url, name="test")
    watcher = await InstanceWatcher(nc, namespace).start()
    try:
        await eventually(lambda: len(watcher.instances) >= count, 30, f"{count} registered workers")
        return {r.role: r for r in watcher.instances.values()}
    finally:
        await watcher.stop()
        await nc.close()


@contextlib.asynccontextmanager
async def frontend(nats_url: str, namespace: str, roles: set[str]):
    fe = await Frontend(
        FrontendSettings(http_host="127.0.0.1", http_port=0, namespace=namespace, nats_server=nats_url)
    ).start()
    try:
        async with asyncio.timeout(30):
            while True:
                entry = fe.registry.get(MODEL)
                if entry and entry.preprocessor and {w.role for w in entry.workers.values()} >= roles:
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.2):
                        await fe.registry.wait_changed()
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{fe.port}/v1", api_key="none", max_retries=0)
        async with client:
            yield client
    finally:
        await fe.stop(drain_s=1)


async def complete(client: openai.AsyncOpenAI, prompt: str) -> tuple[str, object]:
    result = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    streamed = ""
    stream = await client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    async for event in stream:
        streamed += "".join(c.text for c in event.choices)
        usage = event.usage or usage
    assert streamed == result.choices[0].text
    assert usage is not None and usage.completion_tokens == result.usage.completion_tokens
    return result.choices[0].text, result.usage


async def test_aggregated_worker_registers_and_serves_through_the_frontend(fleet, nats_url, namespace):
    fleet.start("null")
    record = (await records(nats_url, namespace, 1))["agg"]
    assert (record.model, record.page_size, record.total_kv_blocks) == (MODEL, 4, 4096 // 4)
    assert record.max_running_requests == 64 and record.bootstrap_port is None
    async with frontend(nats_url, namespace, {"agg"}) as client:
        text, usage = await complete(client, "hello sglang worker")
        assert text and 1 <= usage.completion_tokens <= 8 and usage.prompt_tokens > 0
    call = fleet.fakes["agg"].calls[0]
    assert call["stream"] is True and "bootstrap_room" not in call


async def test_disaggregated_workers_pair_legs_on_one_room_and_match_aggregated(
    fleet, nats_url, namespace, tiny_model
):
    fleet.start("prefill")
    fleet.start("decode")
    found = await records(nats_url, namespace, 2)
    assert found["prefill"].bootstrap_host == "127.0.0.1" and found["prefill"].bootstrap_port == 8998
    assert found["decode"].bootstrap_port is None
    async with frontend(nats_url, namespace, {"prefill", "decode"}) as client:
        text, usage = await complete(client, "hello sglang worker")

    # neither the workers' canaries (the fake bootstrap host) nor the frontend's warm-up of the pair
    def served(role: str) -> list[dict]:
        return [
            c
            for c in fleet.fakes[role].calls
            if c.get("bootstrap_host") != FAKE_BOOTSTRAP_HOST and not str(c.get("rid")).startswith("warmup-")
        ]

    prefill_calls, decode_calls = served("prefill"), served("decode")
    assert prefill_calls[0]["sampling_params"]["max_new_tokens"] == 1
    assert prefill_calls[0]["bootstrap_room"] == decode_calls[0]["bootstrap_room"]
    assert decode_calls[0]["bootstrap_port"] == 8998
    assert usage.prompt_tokens == len(decode_calls[0]["input_ids"])

    agg_namespace = namespace + "-agg"
    agg_fleet = Fleet(nats_url, agg_namespace, tiny_model)
    agg_fleet.start("null")
    try:
        async with frontend(nats_url, agg_namespace, {"agg"}) as client:
            agg_text, agg_usage = await complete(client, "hello sglang worker")
    finally:
        await agg_fleet.stop()
    assert (text, usage.completion_tokens) == (agg_text, agg_usage.completion_tokens)


async def test_a_caller_that_goes_away_aborts_the_sglang_request(fleet, nats_url, namespace):
    fleet.start("null", token_delay_s=0.05)
    record = (await records(nats_url, namespace, 1))["agg"]
    request = GenerateRequest(
        request_id="gone", model=MODEL, token_ids=[5, 6, 7], stop=StopConditions(max_tokens=500)
    )
    async with RequestClient() as client:
        stream = client.generate(record.address, request)
        first = await anext(stream)
        assert first.token_ids
        await stream.aclose()
    fake = fleet.fakes["agg"]
    await eventually(lambda: any(r.startswith("gone-") for r in fake.tokenizer_manager.aborted), 10, "abort")
