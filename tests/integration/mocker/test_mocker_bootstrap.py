"""The prefill/decode rendezvous over a real socket, in-process: either leg may arrive first, a room is
used once and then forgotten, a missing or unreachable peer ends in ``BootstrapTimeout``, and legs of
different KV layouts refuse each other at once (``BootstrapRefused``), whichever arrives first."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from dynamo_worker.mocker.bootstrap import (
    BootstrapRefused,
    BootstrapServer,
    BootstrapTimeout,
    PrefillResult,
    fetch_prefill,
    kv_layout,
)
from dynamo_worker.protocol import BootstrapInfo

from tests.support.ports import refused_port
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

RESULT = PrefillResult(first_token=42, prompt_tokens=10, cached_tokens=4)


@pytest.fixture
async def rendezvous():
    server = BootstrapServer("127.0.0.1", 0)
    port = await server.start()
    async with aiohttp.ClientSession() as session:
        yield server, session, port
    await server.stop()


def info(port: int, room: int) -> BootstrapInfo:
    return BootstrapInfo(bootstrap_host="127.0.0.1", bootstrap_port=port, bootstrap_room=room)


async def test_decode_first_then_prefill(rendezvous):
    server, session, port = rendezvous
    fetching = asyncio.create_task(fetch_prefill(session, info(port, 1), timeout_s=5))
    # the decode leg is waiting in the room before the prefill comes
    await wait_until_async(lambda: server.open_rooms > 0, "the decode leg to open its room", timeout_s=5)
    await server.prefill_done(1, RESULT, wait_s=5)
    assert await fetching == RESULT
    assert server.open_rooms == 0


async def test_prefill_first_then_decode(rendezvous):
    server, session, port = rendezvous
    handing_over = asyncio.create_task(server.prefill_done(2, RESULT, wait_s=5))
    assert await fetch_prefill(session, info(port, 2), timeout_s=5) == RESULT
    await handing_over
    assert server.open_rooms == 0


async def test_a_room_without_prefill_times_out_for_decode(rendezvous):
    server, session, port = rendezvous
    with pytest.raises(BootstrapTimeout, match=r"bootstrap_room=3.*never arrived"):
        await fetch_prefill(session, info(port, 3), timeout_s=0.5)
    assert server.open_rooms == 0


async def test_a_room_without_decode_times_out_for_prefill(rendezvous):
    server, _, _ = rendezvous
    with pytest.raises(BootstrapTimeout, match="no decode leg fetched bootstrap_room=4"):
        await server.prefill_done(4, RESULT, wait_s=0.3)
    assert server.open_rooms == 0


async def test_an_unreachable_prefill_worker_times_out_for_decode():
    async with aiohttp.ClientSession() as session:
        with pytest.raises(BootstrapTimeout, match="could not reach"):
            await fetch_prefill(session, info(refused_port(), 5), timeout_s=0.5)


async def test_a_busy_bootstrap_port_is_a_clear_error(rendezvous):
    _, _, port = rendezvous
    with pytest.raises(OSError, match="--disaggregation-bootstrap-port"):
        await BootstrapServer("127.0.0.1", port).start()


@pytest.mark.parametrize("decode_first", [True, False])
async def test_legs_of_different_kv_layouts_refuse_each_other_at_once(decode_first):
    server = BootstrapServer("127.0.0.1", 0, layout=kv_layout("m", 16))
    port = await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            prefill = asyncio.create_task(server.prefill_done(6, RESULT, wait_s=30))
            if decode_first:
                prefill.cancel()  # only the decode leg for now
                with pytest.raises(asyncio.CancelledError):
                    await prefill
            async with asyncio.timeout(10):  # far below the legs' own 30 s bound
                with pytest.raises(BootstrapRefused, match=r"page_size=16.*page_size=32"):
                    await fetch_prefill(session, info(port, 6), timeout_s=30, layout=kv_layout("m", 32))
                if decode_first:  # a prefill leg arriving after the refusal is refused too
                    prefill = asyncio.create_task(server.prefill_done(6, RESULT, wait_s=30))
                with pytest.raises(BootstrapRefused, match="KV layout mismatch"):
                    await prefill
        # the same layout hands over as usual
        async with aiohttp.ClientSession() as session:
            handing_over = asyncio.create_task(server.prefill_done(7, RESULT, wait_s=5))
            assert await fetch_prefill(session, info(port, 7), 5, layout=kv_layout("m", 16)) == RESULT
            await handing_over
    finally:
        await server.stop()
