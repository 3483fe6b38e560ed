"""LoRA adapters on a mocker worker process, over its system port's ``/v1/loras`` and its request plane,
with a real nats-server: loading (from a PEFT folder, idempotent), listing, unloading; every refusal
with its reason; discovery following each change at once; requests served with the adapter (other
tokens than the base model, KV events that name it) and refused once it is unloaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from dynamo_worker.protocol import BlockStored, GenerateRequest, KvEventBatch, StopConditions
from dynamo_worker.runtime.events import subscribe_kv_events
from dynamo_worker.runtime.request_plane import RequestClient

from tests.support.peft_adapters import write_adapter
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration


async def call(port: int, method: str, path: str, body: Any = None) -> tuple[int, dict]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, f"http://127.0.0.1:{port}{path}", json=body, timeout=aiohttp.ClientTimeout(total=30)
        ) as r,
    ):
        return r.status, await r.json(content_type=None)


def load_body(name: str, uri: str, pinned: bool = False) -> dict:
    return {"lora_name": name, "source": {"uri": uri}, "pinned": pinned}


@pytest.fixture
def adapters(tmp_path, tiny_model) -> dict[str, Path]:
    return {
        "r8": write_adapter(tiny_model, tmp_path / "r8", rank=8, seed=1),
        "r8b": write_adapter(tiny_model, tmp_path / "r8b", rank=8, seed=2),
        "r8c": write_adapter(tiny_model, tmp_path / "r8c", rank=8, seed=3),
        "r32": write_adapter(tiny_model, tmp_path / "r32", rank=32, seed=4),
        "attn": write_adapter(tiny_model, tmp_path / "attn", rank=8, targets=["q_proj", "v_proj"], seed=5),
    }


async def generate(address: str, lora: str | None, rid: str) -> list:
    req = GenerateRequest(
        request_id=rid,
        model="tiny",
        token_ids=list(range(3, 43)),
        stop=StopConditions(max_tokens=6),
        lora_name=lora,
    )
    async with RequestClient() as client:
        return [c async for c in client.generate(address, req)]


def held(mockers, mp) -> list[str]:
    """The adapters discovery lists for ``mp`` now."""
    record = mockers.watcher.instances.get(mp.record.instance_id)
    return [a.name for a in record.lora.adapters] if record and record.lora else []


async def test_load_list_serve_and_unload_an_adapter(mockers, adapters, tmp_path):
    batches: list[KvEventBatch] = []
    sub = await subscribe_kv_events(mockers.nc, mockers.namespace, batches.append)
    mp = mockers.spawn(
        "agg", "--speedup", "100", "--enable-lora", "--max-lora-rank", "16",
        "--lora-target-modules", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
        "--max-loras-per-batch", "2", "--max-loaded-loras", "2",
    )  # fmt: skip
    rec = await mockers.registered(mp)
    assert rec.lora is not None and rec.lora.adapters == [] and rec.lora.max_loras_per_batch == 2
    port = mp.system_port
    uri = f"file://{adapters['r8']}"

    status, body = await call(port, "POST", "/v1/loras", load_body("a1", uri))
    assert status == 200 and body["status"] == "success" and body["lora_name"] == "a1"
    status, body = await call(port, "GET", "/v1/loras")
    assert status == 200
    assert body["loras"] == [{"lora_name": "a1", "uri": uri, "rank": 8, "pinned": False}]
    assert (body["count"], body["max_loaded_loras"], body["max_loras_per_batch"]) == (1, 2, 2)
    # discovery follows at once (a heartbeat is TTL/3 away)
    await wait_until_async(lambda: held(mockers, mp) == ["a1"], "a1 in discovery", timeout_s=5)
    # loading again from the same folder (written as a bare path) does nothing and succeeds
    status, body = await call(port, "POST", "/v1/loras", load_body("a1", str(adapters["r8"])))
    assert status == 200 and "already" in body["message"]
    status, body = await call(port, "POST", "/v1/loras", load_body("a1", f"file://{adapters['r8b']}"))
    assert (status, body["reason"]) == (409, "NameConflict") and "DELETE /v1/loras/a1" in body["message"]

    base = await generate(rec.address, None, "base")
    tuned = await generate(rec.address, "a1", "tuned")
    assert tuned[-1].finish_reason == "length"
    assert [t for c in tuned for t in c.token_ids] != [t for c in base for t in c.token_ids]
    await wait_until_async(
        lambda: any(isinstance(e, BlockStored) and e.lora_name == "a1" for b in batches for e in b.events),
        "a stored block of adapter a1 in the KV events",
        timeout_s=10,
    )

    # a third adapter past --max-loaded-loras 2 evicts the least recently used one (a1 served last)
    await call(port, "POST", "/v1/loras", load_body("a2", f"file://{adapters['r8b']}"))
    await generate(rec.address, "a1", "again")
    status, body = await call(port, "POST", "/v1/loras", load_body("a3", f"file://{adapters['r8c']}"))
    assert status == 200 and body["evicted"] == ["a2"]
    await wait_until_async(lambda: held(mockers, mp) == ["a1", "a3"], "a2 evicted in discovery", timeout_s=5)

    status, body = await call(port, "DELETE", "/v1/loras/a1")
    assert status == 200 and body["lora_name"] == "a1"
    await wait_until_async(lambda: held(mockers, mp) == ["a3"], "only a3 left in discovery", timeout_s=5)
    refused = await generate(rec.address, "a1", "gone")
    assert refused[-1].error is not None and "not loaded on this worker" in refused[-1].error.message
    await sub.unsubscribe()


async def test_every_refusal_names_its_reason_and_the_fix(
    mockers, adapters, tmp_path, tiny_model, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # hf:// finds neither network nor a cached copy
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    plain = mockers.spawn("plain", "--speedup", "100")
    mp = mockers.spawn(
        "agg", "--speedup", "100", "--lora-paths", f"start={adapters['attn']}", "--max-loras-per-batch", "2",
    )  # fmt: skip
    rec = await mockers.registered(mp)
    await mockers.registered(plain)
    # --lora-paths: served from the start; without --max-lora-rank and --lora-target-modules its rank and
    # targets are the limits, as in SGLang
    assert [a.name for a in rec.lora.adapters] == ["start"] and rec.lora.max_lora_rank == 8
    port = mp.system_port
    not_peft = tmp_path / "not-peft"
    not_peft.mkdir()
    cases = [
        (
            plain.system_port,
            load_body("x", f"file://{adapters['r8']}"),
            400,
            "LoraNotEnabled",
            "--enable-lora",
        ),
        (port, {"source": {"uri": "file:///x"}}, 400, "InvalidRequest", "lora_name"),
        (port, load_body("x", "s3://bucket/adapter"), 400, "InvalidSource", "file://"),
        (port, load_body("x", f"file://{tmp_path}/missing"), 400, "InvalidSource", "mount the volume"),
        (port, load_body("x", f"file://{not_peft}"), 400, "InvalidSource", "adapter_config.json"),
        (port, load_body("x", "hf://org/adapter"), 503, "SourceUnreachable", "HF_TOKEN"),
        (port, load_body("x", f"file://{adapters['r32']}"), 400, "RankTooLarge", "--max-lora-rank 32"),
        (port, load_body("x", f"file://{adapters['r8']}"), 400, "IncompatibleAdapter", "down_proj"),
    ]
    for where, body, status, reason, fix in cases:
        got_status, got = await call(where, "POST", "/v1/loras", body)
        assert (got_status, got["status"], got["reason"]) == (status, "error", reason), (body, got)
        assert fix in got["message"], got
    # one pinned adapter of 2 batch slots: pinning another would leave none for the base model
    pinned = write_adapter(tiny_model, tmp_path / "p", rank=4, targets=["q_proj"], seed=6)
    status, body = await call(port, "POST", "/v1/loras", load_body("p1", f"file://{pinned}", True))
    assert status == 200, body
    status, body = await call(port, "POST", "/v1/loras", load_body("p2", f"file://{pinned}", True))
    assert (status, body["reason"]) == (409, "NoFreeSlot") and "--max-loras-per-batch" in body["message"]
    status, body = await call(port, "DELETE", "/v1/loras/nope")
    assert (status, body["reason"]) == (404, "NotFound") and "start" in body["message"]
    status, body = await call(plain.system_port, "GET", "/v1/loras")
    assert (status, body["reason"]) == (400, "LoraNotEnabled")
    assert json.loads(json.dumps(body))  # JSON all the way


async def test_dummy_weights_refuse_every_adapter_with_the_flag_and_the_fix(mockers, adapters):
    """As SGLang under ``--load-format dummy`` (it reads an adapter with the model's load format, which
    reads no files): ``--lora-paths`` with it exits 2 before serving, naming the flag and the fix; with
    ``--enable-lora`` the worker serves the base model, logs the error once, publishes why in discovery
    (``cannot_load``), lists it on ``GET /v1/loras`` and answers every load ``LoraNotSupported``, which
    the operator takes as permanent."""
    refused = mockers.spawn(
        "refused", "--speedup", "100", "--load-format", "dummy", "--lora-paths", f"a={adapters['r8']}"
    )
    await wait_until_async(
        lambda: refused.proc.poll() is not None, "the refused mocker to exit", timeout_s=30
    )
    assert refused.proc.returncode == 2, refused.log()[-2000:]
    assert "--lora-paths cannot be loaded with --load-format dummy" in refused.log()
    assert "--load-format auto" in refused.log()
    mp = mockers.spawn(
        "dummy", "--speedup", "100", "--load-format", "dummy", "--enable-lora",
        "--max-lora-rank", "16", "--lora-target-modules", "all",
    )  # fmt: skip
    rec = await mockers.registered(mp)
    assert rec.lora is not None and rec.lora.cannot_load is not None
    assert "--load-format dummy" in rec.lora.cannot_load
    status, body = await call(mp.system_port, "POST", "/v1/loras", load_body("a", f"file://{adapters['r8']}"))
    assert (status, body["status"], body["reason"]) == (400, "error", "LoraNotSupported"), body
    assert "--load-format dummy" in body["message"] and "--load-format auto" in body["message"]
    status, body = await call(mp.system_port, "GET", "/v1/loras")
    assert status == 200 and body["loras"] == [] and body["cannot_load"] == rec.lora.cannot_load
    assert mp.log().count("it can load no LoRA adapter") == 1
    assert await generate(rec.address, None, "base"), "the base model serves"
