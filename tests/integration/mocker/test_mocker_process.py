"""A mocker worker process end to end with a real nats-server: it registers and serves /live, /health
and /metrics; its model card can be fetched; SIGTERM deregisters at once, aborts in-flight requests
after the grace period and exits 0; a SIGKILLed worker vanishes from discovery within its TTL; its KV
events (prompt and generated blocks, with token ids) and load reach event-plane subscribers in order."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
import urllib.error
import urllib.request

import pytest
from dynamo_worker.protocol import (
    BlockStored,
    GenerateRequest,
    KvEventBatch,
    LoadMetrics,
    StopConditions,
    hash_token_blocks,
)
from dynamo_worker.runtime.discovery import InstanceRemoved
from dynamo_worker.runtime.events import subscribe_kv_events, subscribe_load
from dynamo_worker.runtime.modelcard import fetch_model_card
from dynamo_worker.runtime.request_plane import RequestClient

from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def request(rid: str, max_tokens: int = 5) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid, model="tiny", token_ids=list(range(3, 40)), stop=StopConditions(max_tokens=max_tokens)
    )


async def wait_removed(mockers, instance_id: str, within: float) -> float:
    started = time.monotonic()
    events = mockers.watcher.events()
    try:
        async with asyncio.timeout(within):
            async for ev in events:
                if isinstance(ev, InstanceRemoved) and ev.instance_id == instance_id:
                    return time.monotonic() - started
    finally:
        await events.aclose()
    raise AssertionError("unreachable")


async def test_serves_health_metrics_and_its_model_card(mockers, tiny_model, tmp_path):
    mp = mockers.spawn("agg", "--speedup", "100", "--kv-cache-dtype", "fp8_e4m3", "--enable-metrics")
    rec = await mockers.registered(mp)
    assert (
        "Ignored flags the mocker does not simulate: --kv-cache-dtype fp8_e4m3 --enable-metrics" in mp.log()
    )
    assert (rec.role, rec.model, rec.page_size, rec.bootstrap_port) == ("agg", "tiny", 4, None)
    assert http_get(mp.system_port, "/live")[0] == 200
    status, body = http_get(mp.system_port, "/health")
    assert status == 200 and json.loads(body)["status"] == "ready"

    async with RequestClient() as client:
        chunks = [c async for c in client.generate(rec.address, request("a"))]
    assert chunks[-1].finish_reason == "length"
    metrics = http_get(mp.system_port, "/metrics")[1]
    assert 'dynamo_worker_requests_total{outcome="length"} 1.0' in metrics
    assert "dynamo_worker_output_tokens_total 5.0" in metrics
    assert "dynamo_worker_kv_total_blocks 16384.0" in metrics

    assert rec.model_card_checksum is not None
    card, folder = await fetch_model_card(mockers.nc, rec.model_card_checksum, tmp_path / "cards")
    assert card.name == "tiny" and card.page_size == 4 and card.eos_token_ids
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json"):
        assert (folder / name).read_bytes() == (tiny_model / name).read_bytes()


async def test_sigkilled_worker_vanishes_within_its_ttl(mockers):
    ttl = 2
    mp = mockers.spawn("victim", "--discovery-ttl", str(ttl))
    rec = await mockers.registered(mp)
    mp.proc.send_signal(signal.SIGKILL)
    mp.proc.wait(10)
    await wait_removed(mockers, rec.instance_id, within=ttl + 3)  # TTL plus server expiry granularity


async def test_sigterm_deregisters_first_aborts_after_grace_and_exits_zero(mockers):
    mp = mockers.spawn("drained", "--discovery-ttl", "60", "--graceful-shutdown-s", "1", "--speedup", "1")
    rec = await mockers.registered(mp)
    async with RequestClient() as client:
        stream = client.generate(rec.address, request("long", max_tokens=100_000))
        first = await anext(stream)
        assert first.token_ids
        mp.proc.send_signal(signal.SIGTERM)
        # Removed long before the 60 s TTL: the worker deleted its key first.
        await wait_removed(mockers, rec.instance_id, within=10)
        async with asyncio.timeout(15):
            rest = [c async for c in stream]
    assert rest[-1].finish_reason == "error" and rest[-1].error.type == "shutting_down"
    assert mp.proc.wait(15) == 0
    assert "Worker stopped" in mp.log()


async def test_kv_events_and_load_of_a_mocker_reach_subscribers_in_order(mockers):
    batches: list[KvEventBatch] = []
    loads: list[LoadMetrics] = []
    kv_sub = await subscribe_kv_events(mockers.nc, mockers.namespace, batches.append)
    load_sub = await subscribe_load(mockers.nc, mockers.namespace, loads.append)
    mp = mockers.spawn("agg", "--speedup", "100")
    rec = await mockers.registered(mp)
    prompt = list(range(3, 43))  # ten blocks of 4
    async with RequestClient() as client:
        req = request("a", max_tokens=9).model_copy(update={"token_ids": prompt})
        chunks = [c async for c in client.generate(rec.address, req)]
    generated = [t for c in chunks for t in c.token_ids]
    stored = hash_token_blocks([*prompt, *generated[:8]], 4)  # the last token's KV is not kept
    await wait_until_async(
        lambda: (
            sum(len(e.block_hashes) for b in batches for e in b.events if isinstance(e, BlockStored)) >= 12
        ),
        "12 stored blocks in the KV events",
        timeout_s=10,
        interval_s=0.02,
        explain=lambda: f"KV events missing: {batches}",
    )
    assert all(b.instance_id == rec.instance_id for b in batches)
    assert [b.seq for b in batches] == list(range(len(batches)))
    events = [e for b in batches for e in b.events]
    assert events[0] == BlockStored(parent_hash=None, block_hashes=stored[:10], token_ids=prompt)
    assert [h for e in events for h in e.block_hashes] == stored
    assert any(m.instance_id == rec.instance_id and m.total_blocks == 16384 for m in loads)
    await kv_sub.unsubscribe()
    await load_sub.unsubscribe()


async def test_a_non_leader_rank_registers_nothing_and_stops_on_sigterm(mockers):
    mp = mockers.spawn("follower", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "leader:29500")

    def said_so() -> bool:
        assert mp.proc.poll() is None, mp.log()
        return "Non-leader rank" in mp.log()

    await wait_until_async(
        said_so, "the follower to log Non-leader rank", timeout_s=30, interval_s=0.05, explain=mp.log
    )
    assert not [r for r in mockers.watcher.instances.values() if r.component == "follower"]
    mp.proc.send_signal(signal.SIGTERM)
    assert mp.proc.wait(15) == 0


@pytest.mark.parametrize(
    ("flag", "listener"),
    [
        ("--disaggregation-bootstrap-port", "the bootstrap server"),
        ("--request-port", "the request plane"),
        ("--system-port", "the system server"),
    ],
)
async def test_a_busy_port_ends_the_process_with_an_error_naming_its_flag(mockers, flag, listener):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        mp = mockers.spawn("prefill", "--disaggregation-mode", "prefill", flag, str(port))
        await wait_until_async(
            lambda: mp.proc.poll() is not None,
            "the mocker to exit",
            timeout_s=30,
            interval_s=0.05,
            explain=mp.log,
        )
    assert mp.proc.returncode == 1
    said = mp.log()
    assert f"{listener} cannot listen on 127.0.0.1:{port}: the port is in use" in said
    assert f"pass another {flag}, or {flag} 0 for any free port" in said
    assert "Traceback" not in said
