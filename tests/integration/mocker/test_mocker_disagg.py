"""Disaggregated serving with two mocker processes (a prefill and a decode worker) through the request
plane: both legs sent at once complete the request; a leg whose peer never comes fails with
``bootstrap_timeout`` and a message naming the room, within its bound. SGLang's KV handoff, as the
load reports on the event plane show it: a prefill leg waits in the bootstrap queue for its decode leg's
handshake, a decode worker without KV room holds both legs, and the first transfer from a prefill
engine pays for opening the connection once."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from dynamo_worker.protocol import BootstrapInfo, GenerateRequest, LoadMetrics, StopConditions
from dynamo_worker.runtime.events import subscribe_load
from dynamo_worker.runtime.request_plane import RequestClient

from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

BOOTSTRAP_TIMEOUT_S = 2.0


def legs(prefill_record, room: int, max_tokens: int = 6) -> tuple[GenerateRequest, GenerateRequest]:
    info = BootstrapInfo(
        bootstrap_host=prefill_record.bootstrap_host,
        bootstrap_port=prefill_record.bootstrap_port,
        bootstrap_room=room,
    )
    decode = GenerateRequest(
        request_id=f"d-{room}",
        model="tiny",
        token_ids=list(range(3, 43)),
        stop=StopConditions(max_tokens=max_tokens),
        bootstrap_info=info,
    )
    prefill = decode.model_copy(update={"request_id": f"p-{room}", "stop": StopConditions(max_tokens=1)})
    return prefill, decode


async def collect(client: RequestClient, address: str, req: GenerateRequest):
    async with asyncio.timeout(BOOTSTRAP_TIMEOUT_S + 10):
        return [c async for c in client.generate(address, req)]


@pytest.fixture
async def pair(mockers):
    args = ("--speedup", "20", "--bootstrap-timeout-s", str(BOOTSTRAP_TIMEOUT_S))
    prefill = mockers.spawn(
        "prefill", "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0", *args
    )
    decode = mockers.spawn("decode", "--disaggregation-mode", "decode", *args)
    p, d = await mockers.registered(prefill), await mockers.registered(decode)
    async with RequestClient() as client:
        yield client, p, d


async def test_prefill_and_decode_legs_complete_a_request(pair):
    client, p, d = pair
    assert p.role == "prefill" and p.bootstrap_port is not None and p.bootstrap_host == "127.0.0.1"
    assert d.role == "decode" and d.bootstrap_port is None
    prefill_req, decode_req = legs(p, random.getrandbits(63))
    pre, dec = await asyncio.gather(
        collect(client, p.address, prefill_req), collect(client, d.address, decode_req)
    )
    assert len(pre) == 1 and pre[0].finish_reason == "length" and len(pre[0].token_ids) == 1
    tokens = [t for c in dec for t in c.token_ids]
    assert len(tokens) == 6 and tokens[0] == pre[0].token_ids[0]
    assert dec[-1].finish_reason == "length"
    assert dec[-1].usage.prompt_tokens == 40 and dec[-1].usage.completion_tokens == 6

    # The same prompt again: the prefill worker's prefix cache hit is reported by the decode leg.
    prefill_req, decode_req = legs(p, random.getrandbits(63))
    _, dec2 = await asyncio.gather(
        collect(client, p.address, prefill_req), collect(client, d.address, decode_req)
    )
    assert dec2[-1].usage.cached_tokens == 39  # all of the prompt but its last token, recomputed
    assert [t for c in dec2 for t in c.token_ids] == tokens


async def test_decode_leg_without_its_prefill_fails_with_bootstrap_timeout(pair):
    client, p, d = pair
    room = random.getrandbits(63)
    _, decode_req = legs(p, room)
    chunks = await collect(client, d.address, decode_req)
    assert len(chunks) == 1 and chunks[0].error is not None
    assert chunks[0].error.type == "bootstrap_timeout"
    assert f"bootstrap_room={room}" in chunks[0].error.message


async def test_prefill_leg_without_its_decode_fails_with_bootstrap_timeout(pair):
    client, p, _ = pair
    room = random.getrandbits(63)
    prefill_req, _ = legs(p, room)
    chunks = await collect(client, p.address, prefill_req)
    assert chunks[-1].error is not None and chunks[-1].error.type == "bootstrap_timeout"
    assert f"bootstrap_room={room}" in chunks[-1].error.message


async def test_decode_leg_fails_when_the_prefill_worker_is_gone(pair, mockers):
    client, p, d = pair
    prefill_proc = next(m for m in mockers.procs if m.component == "prefill")
    prefill_proc.stop()
    _, decode_req = legs(p, random.getrandbits(63))
    chunks = await collect(client, d.address, decode_req)
    assert chunks[-1].error is not None and chunks[-1].error.type == "bootstrap_timeout"
    assert "could not reach" in chunks[-1].error.message


async def reports(mockers, got: list[LoadMetrics]):
    """Subscribe ``got`` to the namespace's load reports (the real event plane)."""
    assert mockers.nc is not None
    return await subscribe_load(mockers.nc, mockers.namespace, got.append)


async def test_a_prefill_leg_waits_in_its_bootstrap_queue_for_the_decode_legs_handshake(pair, mockers):
    """As in SGLang: a prefill is computed only once its decode worker has reserved memory for its KV;
    meanwhile the prefill worker reports it in its bootstrap queue, its prompt as queued prefill."""
    client, p, d = pair
    got: list[LoadMetrics] = []
    sub = await reports(mockers, got)
    prefill_req, decode_req = legs(p, random.getrandbits(63))
    prefilling = asyncio.create_task(collect(client, p.address, prefill_req))
    await wait_until_async(
        lambda: any(m.instance_id == p.instance_id and m.bootstrap_queue == 1 for m in got),
        "the prefill worker to report the leg in its bootstrap queue",
        timeout_s=10,
    )
    waiting = next(m for m in got if m.instance_id == p.instance_id and m.bootstrap_queue == 1)
    assert waiting.waiting == 1 and waiting.waiting_prefill_tokens == 40 and waiting.running == 0
    decoded = await collect(client, d.address, decode_req)
    assert decoded[-1].finish_reason == "length" and (await prefilling)[-1].finish_reason == "length"
    await sub.unsubscribe()


async def test_a_decode_worker_without_kv_room_holds_both_legs_until_it_has_some(mockers):
    """The decode worker's KV cache holds one request: a second one waits in its prealloc queue, its
    prefill leg in the prefill worker's bootstrap queue (the stall a full decode worker causes), and
    both go on once the first request frees its blocks."""
    args = ("--speedup", "20", "--bootstrap-timeout-s", "30")
    prefill = mockers.spawn(
        "prefill", "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0", *args
    )
    # 12 blocks of 4 tokens: a 40-token prompt and 8 tokens of output fill them; slow decode steps
    decode = mockers.spawn(
        "decode",
        "--disaggregation-mode",
        "decode",
        "--num-kv-blocks",
        "12",
        "--decode-base-ms",
        "2000",
        *args,
    )
    p, d = await mockers.registered(prefill), await mockers.registered(decode)
    got: list[LoadMetrics] = []
    sub = await reports(mockers, got)
    async with RequestClient() as client:
        first_p, first_d = legs(p, random.getrandbits(63), max_tokens=8)
        second_p, second_d = legs(p, random.getrandbits(63), max_tokens=2)
        second_p = second_p.model_copy(update={"token_ids": list(range(100, 140))})
        second_d = second_d.model_copy(update={"token_ids": list(range(100, 140))})
        first = asyncio.gather(collect(client, p.address, first_p), collect(client, d.address, first_d))
        await wait_until_async(
            lambda: any(m.instance_id == d.instance_id and m.running == 1 for m in got),
            "the first request to decode",
            timeout_s=10,
        )
        second = asyncio.gather(collect(client, p.address, second_p), collect(client, d.address, second_d))
        await wait_until_async(
            lambda: (
                any(m.instance_id == d.instance_id and m.prealloc_queue == 1 for m in got)
                and any(m.instance_id == p.instance_id and m.bootstrap_queue == 1 for m in got)
            ),
            "the second request in the decode worker's prealloc queue and the prefill's bootstrap queue",
            timeout_s=10,
        )
        for pre, dec in (await first, await second):
            assert pre[-1].finish_reason == "length" and dec[-1].finish_reason == "length"
    await sub.unsubscribe()


async def test_the_first_transfer_from_a_prefill_engine_opens_the_connection_once(mockers):
    """``--kv-first-transfer-s``: what the first KV transfer of a new pair costs on GPUs (NIXL), paid by
    the pair's first request only (here 20 s / speedup 20 = 1 s)."""
    args = ("--speedup", "20", "--kv-first-transfer-s", "20")
    prefill = mockers.spawn(
        "prefill", "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0", *args
    )
    decode = mockers.spawn("decode", "--disaggregation-mode", "decode", *args)
    p, d = await mockers.registered(prefill), await mockers.registered(decode)
    async with RequestClient() as client:
        started = time.monotonic()
        for _ in range(3):
            prefill_req, decode_req = legs(p, random.getrandbits(63))
            done = await asyncio.gather(
                collect(client, p.address, prefill_req), collect(client, d.address, decode_req)
            )
            assert all(legs_[-1].finish_reason == "length" for legs_ in done)
    assert time.monotonic() - started >= 1.0
    assert decode.log().count("Opening the KV transfer connection to a new prefill engine") == 1
