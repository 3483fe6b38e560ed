"""``Frontend.stop`` undoes ``start`` last part first: it stops taking connections, lets an in-flight
stream finish within ``drain_s`` (its worker connection stays open until then), then closes the rest;
a second stop does nothing; a start that fails part-way is undone by stop and leaves no task running.
Real nats-server, a mocker process, the official ``openai`` client."""

from __future__ import annotations

import asyncio
import socket

import openai
import pytest
from dynamo_worker.frontend.app import Frontend
from dynamo_worker.frontend.settings import FrontendSettings

from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "Tell me a long story."}]


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


async def test_stop_refuses_new_connections_and_lets_the_in_flight_stream_finish(
    mockers, frontend_factory, wait_workers
):
    m = mockers("null", speedup=0.1)  # 80 ms a token: the stream outlasts the steps below
    fe = await frontend_factory()
    await wait_workers(fe, 1, mockers=[m])
    assert fe.port is not None
    port = fe.port
    async with openai.AsyncOpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=60) as c:
        stream = await c.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=25, stream=True, extra_body={"ignore_eos": True}
        )
        chunks = [await anext(aiter(stream))]
        stopping = asyncio.create_task(fe.stop(drain_s=60))
        await wait_until_async(lambda: _refused(port), "the port to refuse new connections", timeout_s=10)
        assert not stopping.done(), "stop waits for the in-flight stream"
        chunks += [chunk async for chunk in stream]
    async with asyncio.timeout(30):
        await stopping
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finish == ["length"]
    assert fe.nc is None
    await fe.stop()  # nothing left to stop


async def test_a_start_that_fails_part_way_is_undone_by_stop(nats_url, namespace):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        before = asyncio.all_tasks()
        fe = Frontend(
            FrontendSettings(
                http_host="127.0.0.1",
                http_port=busy.getsockname()[1],
                namespace=namespace,
                nats_server=nats_url,
                router_mode="kv",
            )
        )
        with pytest.raises(OSError, match="the port is in use"):
            await fe.start()  # NATS, the registry, the KV feed and the discovery watch had started
        assert fe.nc is not None and not fe.discovery.done()
        async with asyncio.timeout(30):
            await fe.stop(drain_s=0)
    assert fe.nc is None and fe.discovery.cancelled()
    left = [t for t in asyncio.all_tasks() - before if not t.done()]
    assert left == [], f"tasks still running after stop: {left}"
