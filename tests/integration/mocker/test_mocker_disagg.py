"""Disaggregated serving with two mocker processes (a prefill and a decode worker) through the request
plane: both legs sent at once complete the request; a leg whose peer never comes fails with
``bootstrap_timeout`` and a message naming the room, within its bound."""

from __future__ import annotations

import asyncio
import random

import pytest
from dynamo_worker.protocol import BootstrapInfo, GenerateRequest, StopConditions
from dynamo_worker.runtime.request_plane import RequestClient

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
