"""LoRA on the SGLang worker: SGLang's flags set the limits and the adapters it starts with, ``/v1/loras``
loads and unloads through ``async_load_lora_adapter`` / ``async_unload_lora_adapter`` (refusals mapped to
our reasons, evictions past ``--max-loaded-loras`` followed), requests pass the adapter as ``lora_path``,
and an adapter this worker does not hold is refused (SGLang would quietly load one it once held);
SGLang 0.5.23's KV events name the adapter, and the relay carries the name on.

SGLang needs a GPU, which this machine lacks: ``SglangEngine`` runs on
``tests.support.sglang_fake.FakeSglangEngine`` (SGLang's signatures, ``LoRAUpdateOutput``'s fields and
its eviction); the worker, its system server, NATS and discovery are real.
"""

from __future__ import annotations

import uuid

import aiohttp
import pytest
from dynamo_worker.protocol import BlockStored, GenerateRequest, StopConditions
from dynamo_worker.runtime.settings import RuntimeSettings
from dynamo_worker.runtime.worker import Worker
from dynamo_worker.sglang.args import SglangSettings, WorkerPlan
from dynamo_worker.sglang.engine import SglangEngine, lora_refusal
from dynamo_worker.sglang.handler import generate_kwargs
from dynamo_worker.sglang.kv_events import decode_batch
from dynamo_worker.tinymodel import ensure_tiny_model

from tests.support.peft_adapters import write_adapter
from tests.support.sglang_fake import FAKE_BOOTSTRAP_HOST, FakeServerArgs, FakeSglangEngine

pytestmark = pytest.mark.integration

PROMPT = [11, 12, 13, 14, 15]


def request(lora: str | None) -> GenerateRequest:
    return GenerateRequest(
        request_id="r", model="m", token_ids=PROMPT, stop=StopConditions(max_tokens=4), lora_name=lora
    )


def test_a_request_passes_its_adapter_as_lora_path():
    assert generate_kwargs(request("a1"), "agg", "rid")["lora_path"] == "a1"
    assert "lora_path" not in generate_kwargs(request(None), "agg", "rid")


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (
            "Failed to load LoRA adapter x as a pinned adapter. It is not allowed to pin all slots",
            "NoFreeSlot",
        ),
        (
            "LoRA adapter x with rank 64 is incompatible with the current LoRA memory pool",
            "IncompatibleAdapter",
        ),
        ("LoRA is not enabled. Please set `--enable-lora` to enable LoRA.", "LoraNotEnabled"),
        ("LoRA with name x does not exist. Loaded LoRAs: []", "NotFound"),
        ("CUDA out of memory", "LoadFailed"),
    ],
)
def test_sglangs_refusals_become_our_reasons(message, reason):
    error = lora_refusal("x", message)
    assert error.reason == reason and message in error.message


def test_the_relay_carries_the_adapter_sglang_names_on_its_blocks():
    event = {
        "type": "BlockStored",
        "block_hashes": [5],
        "token_ids": [1, 2],
        "block_size": 2,
        "lora_name": "a1",
    }
    base = {"type": "BlockStored", "block_hashes": [6], "token_ids": [1, 2], "block_size": 2}
    decoded = decode_batch([1.0, [event, base], 0]).events
    assert decoded == [
        BlockStored(parent_hash=None, block_hashes=[5], token_ids=[1, 2], lora_name="a1"),
        BlockStored(parent_hash=None, block_hashes=[6], token_ids=[1, 2]),
    ]


def plan_for(server_args: FakeServerArgs, nats_url: str) -> WorkerPlan:
    return WorkerPlan(
        server_args=server_args,
        runtime=RuntimeSettings(
            namespace="sl-" + uuid.uuid4().hex[:8],
            nats_server=nats_url,
            system_port=0,
            request_port=0,
            listen_host="127.0.0.1",
        ),
        settings=SglangSettings(canary_interval_s=0.5, warmup_timeout_s=5),
        bootstrap_host="127.0.0.1",
        fake_bootstrap_host=FAKE_BOOTSTRAP_HOST,
    )


async def test_the_worker_loads_serves_and_unloads_adapters_on_sglang(nats_url, tmp_path):
    model = ensure_tiny_model(tmp_path / "model")
    a1, a2, a3 = (
        write_adapter(model, tmp_path / n, rank=8, seed=i) for i, n in enumerate(("a1", "a2", "a3"))
    )
    fakes: list[FakeSglangEngine] = []
    server_args = FakeServerArgs(
        model_path=str(model),
        served_model_name="m",
        page_size=4,
        lora_paths=[f"start={a1}"],
        max_loaded_loras=2,
        max_loras_per_batch=2,
    )
    plan = plan_for(server_args, nats_url)
    engine = SglangEngine(plan, engine_factory=lambda sa: fakes.append(FakeSglangEngine(sa)) or fakes[-1])
    worker = Worker(engine, plan.runtime)
    record = await worker.start()
    try:
        assert [a.name for a in record.lora.adapters] == ["start"] and record.lora.max_lora_rank == 8
        url = f"http://127.0.0.1:{worker.system.port}/v1/loras"
        async with aiohttp.ClientSession() as http:
            body = {"lora_name": "a2", "source": {"uri": f"file://{a2}"}}
            async with http.post(url, json=body) as r:
                assert r.status == 200, await r.json()
            tuned = [c async for c in engine.generate(request("a2"))]
            assert [t for c in tuned for t in c.token_ids] == fakes[0].expected_tokens(PROMPT, 4, "a2")
            assert fakes[0].calls[-1]["lora_path"] == "a2"
            # a third adapter past --max-loaded-loras 2: SGLang evicts the oldest unpinned, and so do we
            async with http.post(url, json={"lora_name": "a3", "source": {"uri": str(a3)}}) as r:
                assert (await r.json())["evicted"] == ["start"]
            assert [a.name for a in worker.record.lora.adapters] == ["a2", "a3"]
            refused = [c async for c in engine.generate(request("start"))]
            assert "not loaded on this worker" in refused[-1].error.message
            async with http.delete(url + "/a2") as r:
                assert r.status == 200
            async with http.delete(url + "/a2") as r:
                assert (r.status, (await r.json())["reason"]) == (404, "NotFound")
            assert list(fakes[0].loras) == ["a3"]
            assert [a.name for a in worker.record.lora.adapters] == ["a3"]
            # SGLang holds an adapter the worker does not list (a load of ours that passed its bound
            # and finished later): loading it again adopts it instead of refusing it
            fakes[0].loras["late"] = (str(a1), False)
            async with http.post(url, json={"lora_name": "late", "source": {"uri": str(a1)}}) as r:
                assert r.status == 200, await r.json()
            assert [a.name for a in worker.record.lora.adapters] == ["a3", "late"]
    finally:
        await worker.shutdown()


async def test_under_dummy_weights_the_worker_refuses_every_adapter_before_sglang_sees_it(
    nats_url, tmp_path, caplog
):
    """SGLang under ``--load-format dummy`` cannot read an adapter (its loader for the adapter's files is
    the model's dummy one): the worker logs it once at start, publishes why (``cannot_load``) and answers
    a load ``LoraNotSupported`` with the flag and the fix, without asking SGLang; the base model serves."""
    model = ensure_tiny_model(tmp_path / "model")
    adapter = write_adapter(model, tmp_path / "a1", rank=8, seed=1)
    fakes: list[FakeSglangEngine] = []
    server_args = FakeServerArgs(
        model_path=str(model),
        served_model_name="m",
        page_size=4,
        enable_lora=True,
        max_lora_rank=16,
        lora_target_modules=["all"],
        load_format="dummy",
    )
    engine = SglangEngine(
        plan_for(server_args, nats_url),
        engine_factory=lambda sa: fakes.append(FakeSglangEngine(sa)) or fakes[-1],
    )
    worker = Worker(engine, engine.plan.runtime)
    with caplog.at_level("ERROR", logger="dynamo_worker"):
        record = await worker.start()
    try:
        assert record.lora is not None and "--load-format dummy" in (record.lora.cannot_load or "")
        assert sum("it can load no LoRA adapter" in r.getMessage() for r in caplog.records) == 1
        url = f"http://127.0.0.1:{worker.system.port}/v1/loras"
        async with aiohttp.ClientSession() as http:
            body = {"lora_name": "a1", "source": {"uri": f"file://{adapter}"}}
            async with http.post(url, json=body) as r:
                got = await r.json()
                assert (r.status, got["reason"]) == (400, "LoraNotSupported"), got
                assert "--load-format auto" in got["message"]
            async with http.get(url) as r:
                assert (await r.json())["cannot_load"] == record.lora.cannot_load
        assert fakes[0].loras == {}  # SGLang was never asked
        base = [c async for c in engine.generate(request(None))]
        assert [t for c in base for t in c.token_ids] == fakes[0].expected_tokens(PROMPT, 4, None)
    finally:
        await worker.shutdown()
