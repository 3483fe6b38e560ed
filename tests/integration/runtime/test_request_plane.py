"""The request plane over real sockets: streaming (a chunk is handed on as soon as it arrives; chunks
that arrive together are handed on as one), many requests multiplexed over one connection, the
in-flight bound (``overloaded``), invalid requests and clients that do not speak the protocol,
cancellation reaching the engine when the client goes away, every wait bounded, typed errors when the
worker is unreachable or dies mid-stream, and draining."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import orjson
import pytest
from dynamo_worker.protocol import GenerateChunk, GenerateRequest, StopConditions, Usage
from dynamo_worker.runtime.request_plane import (
    MAGIC,
    RequestClient,
    RequestServer,
    WorkerRejected,
    WorkerStreamBroken,
    WorkerTimeout,
    WorkerUnreachable,
)

from tests.support.ports import refused_port
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration


def request(rid: str = "r", max_tokens: int = 3) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid, model="m", token_ids=[1, 2], stop=StopConditions(max_tokens=max_tokens)
    )


class FakeEngine:
    """Streams ``max_tokens`` tokens, or holds a request until released; records what it saw.
    (The engine is faked: what is under test is the transport.)"""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.closed: list[str] = []
        self.hold = False
        self.peers: list[object] = []

    async def generate(self, req: GenerateRequest):
        self.started.set()
        try:
            for i in range(req.stop.max_tokens - 1):
                yield GenerateChunk(token_ids=[i + 10])
                if self.hold:
                    await self.release.wait()
            yield GenerateChunk(
                token_ids=[99],
                finish_reason="length",
                usage=Usage(prompt_tokens=len(req.token_ids), completion_tokens=req.stop.max_tokens),
            )
        finally:
            self.closed.append(req.request_id)


@pytest.fixture
async def served():
    engine = FakeEngine()
    server = RequestServer(engine.generate, host="127.0.0.1", port=0, max_inflight=2)
    port = await server.start()
    async with RequestClient(connect_timeout_s=2, first_token_timeout_s=5, inter_token_timeout_s=5) as client:
        yield engine, server, client, f"127.0.0.1:{port}"
    await server.stop()


async def test_streams_disjoint_chunks_until_the_final_one(served):
    _, _, client, address = served
    chunks = [c async for c in client.generate(address, request(max_tokens=4))]
    # Lines that arrive together are handed on as one chunk: the ids, in order, are what counts.
    assert [t for c in chunks for t in c.token_ids] == [10, 11, 12, 99]
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage.completion_tokens == 4


async def test_a_chunk_that_arrives_alone_is_handed_on_at_once(served):
    engine, _, client, address = served
    engine.hold = True  # the engine stops after its first token until released
    stream = client.generate(address, request(max_tokens=3))
    assert (await anext(stream)).token_ids == [10]
    engine.release.set()
    assert [t for c in [c async for c in stream] for t in c.token_ids] == [11, 99]


async def test_connections_are_reused(served):
    _, server, client, address = served
    for i in range(5):
        assert [c async for c in client.generate(address, request(f"r{i}"))][-1].finish_reason == "length"
        assert server.open_connections == 1  # the same keep-alive connection every time


async def test_beyond_max_inflight_is_rejected_as_overloaded(served):
    engine, _, client, address = served
    engine.hold = True
    streams = [client.generate(address, request(f"h{i}", 5)) for i in range(2)]
    for s in streams:
        await anext(s)
    with pytest.raises(WorkerRejected) as err:
        await anext(client.generate(address, request("third")))
    assert err.value.status == 503 and err.value.error_type == "overloaded"
    engine.release.set()
    for s in streams:
        assert [c async for c in s][-1].finish_reason == "length"


async def test_concurrent_requests_share_one_connection_and_get_their_own_streams(served):
    _engine, server, client, address = served
    server.max_inflight = 64

    async def run(i: int) -> list[GenerateChunk]:
        return [c async for c in client.generate(address, request(f"m{i}", 2 + i))]

    results = await asyncio.gather(*(run(i) for i in range(40)))
    for i, chunks in enumerate(results):
        tokens = [t for c in chunks for t in c.token_ids]
        assert tokens == [*range(10, 10 + 1 + i), 99]  # this request's tokens, in order, once
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2 + i
    assert server.open_connections == 1 and client.open_connections == 1


async def test_an_invalid_request_is_rejected_with_400(served):
    _, _, _, address = served
    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(MAGIC + b'G1 {"request_id": "x"}\n')
    async with asyncio.timeout(5):
        line = await reader.readline()
    status, error = line.split(b" ", 2)[1:]
    assert line.startswith(b"R1 ") and status == b"400"
    assert orjson.loads(error)["type"] == "invalid_request"
    writer.close()


async def test_an_http_client_is_told_what_the_port_is(served):
    """Someone who curls a worker's request port gets a 400 naming the port's purpose, not a hang."""
    _, _, _, address = served
    async with aiohttp.ClientSession() as session, session.get(f"http://{address}/v1/models") as r:
        assert r.status == 400
        assert "request plane" in await r.text()


async def test_closing_the_stream_cancels_the_request_on_the_worker(served):
    engine, server, client, address = served
    engine.hold = True
    stream = client.generate(address, request("gone", 100))
    await anext(stream)
    await stream.aclose()
    await wait_until_async(
        lambda: "gone" in engine.closed and not server.inflight,
        "the worker to close request gone",
        timeout_s=5,
    )


async def test_cancelling_the_caller_task_cancels_the_request_on_the_worker(served):
    engine, server, client, address = served
    engine.hold = True

    async def consume():
        async for _ in client.generate(address, request("task", 100)):
            pass

    task = asyncio.create_task(consume())
    async with asyncio.timeout(5):
        await engine.started.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await wait_until_async(
        lambda: "task" in engine.closed and not server.inflight,
        "the worker to close request task",
        timeout_s=5,
    )


async def test_unreachable_worker_raises_worker_unreachable():
    async with RequestClient(connect_timeout_s=2) as client:
        with pytest.raises(WorkerUnreachable, match="could not connect") as e:
            await anext(client.generate(f"127.0.0.1:{refused_port()}", request()))
    assert "ConnectionKey" not in str(e.value)  # a readable reason, not aiohttp's internal repr


async def test_no_first_chunk_and_idle_stream_time_out(served):
    engine, _, client, address = served
    engine.hold = True
    stream = client.generate(address, request("slow", 5), inter_token_timeout_s=0.3)
    await anext(stream)
    with pytest.raises(WorkerTimeout, match="next chunk"):
        await anext(stream)

    async def never(_req):
        await asyncio.Event().wait()
        yield GenerateChunk()

    server = RequestServer(never, host="127.0.0.1", port=0)
    port = await server.start()
    with pytest.raises(WorkerTimeout, match=r"first chunk|no answer"):
        await anext(client.generate(f"127.0.0.1:{port}", request(), first_token_timeout_s=0.3))
    await server.stop()


async def test_a_worker_dying_mid_stream_raises_worker_stream_broken():
    """A raw socket server plays a worker that crashes after one chunk."""

    async def crashing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await reader.readexactly(len(MAGIC)) == MAGIC
        assert (await reader.readline()).startswith(b"G1 ")
        writer.write(b'D1 {"token_ids":[5]}\n')
        await writer.drain()
        writer.transport.abort()

    server = await asyncio.start_server(crashing, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with RequestClient() as client:
        stream = client.generate(f"127.0.0.1:{port}", request())
        assert (await anext(stream)).token_ids == [5]
        with pytest.raises(WorkerStreamBroken):
            await anext(stream)
    server.close()
    await server.wait_closed()


async def test_drain_refuses_new_requests_and_aborts_leftovers(served):
    engine, server, client, address = served
    engine.hold = True
    stream = client.generate(address, request("inflight", 10))
    await anext(stream)
    drain = asyncio.create_task(server.drain(grace_s=0.2))
    await wait_until_async(lambda: server.draining, "the server to drain", timeout_s=5)
    with pytest.raises(WorkerRejected) as err:
        await anext(client.generate(address, request("new")))
    assert err.value.error_type == "shutting_down"
    assert await drain == 1
    rest = [c async for c in stream]
    assert rest[-1].error is not None and rest[-1].error.type == "shutting_down"


async def _raw_worker(body: bytes) -> asyncio.Server:
    """A raw socket server playing a worker that sends ``body`` (chunk lines of stream 1) in one write."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await reader.readexactly(len(MAGIC)) == MAGIC
        assert (await reader.readline()).startswith(b"G1 ")
        writer.write(b"".join(b"D1 " + line + b"\n" for line in body.splitlines()))
        await writer.drain()
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


@pytest.mark.parametrize(
    "bad_line",
    [
        b'{"token_ids":["x"]}',
        b'{"token_ids":[1]',
        b'{"token_ids":[1],"finish_reason":"bogus"}',
        b'{"token_ids":"12"}',
    ],
)
async def test_an_invalid_line_among_lines_that_arrive_together_breaks_the_stream(bad_line):
    server = await _raw_worker(b'{"token_ids":[5]}\n' + bad_line + b'\n{"token_ids":[6]}\n')
    port = server.sockets[0].getsockname()[1]
    async with RequestClient() as client:
        with pytest.raises(WorkerStreamBroken, match="invalid chunk"):
            [c async for c in client.generate(f"127.0.0.1:{port}", request())]
    server.close()
    await server.wait_closed()


async def test_a_field_a_newer_worker_adds_is_ignored_not_an_error():
    """Chunks are upgrade-safe: an older frontend reads a newer worker's stream (a rolling upgrade)."""
    usage = b'"usage":{"prompt_tokens":2,"completion_tokens":2}'
    final = b'{"token_ids":[6],"finish_reason":"length",' + usage + b',"new":1}'
    server = await _raw_worker(b'{"token_ids":[5],"extra":1}\n' + final + b"\n")
    port = server.sockets[0].getsockname()[1]
    async with RequestClient() as client:
        chunks = [c async for c in client.generate(f"127.0.0.1:{port}", request())]
    assert [(c.token_ids, c.finish_reason) for c in chunks] == [([5, 6], "length")]
    server.close()
    await server.wait_closed()


async def test_token_lines_that_arrive_together_are_handed_on_as_one_chunk():
    final = b'{"token_ids":[8],"finish_reason":"length","usage":{"prompt_tokens":2,"completion_tokens":4}}'
    server = await _raw_worker(b'{"token_ids":[5]}\n{"token_ids":[6,7]}\n{"token_ids":[]}\n' + final + b"\n")
    port = server.sockets[0].getsockname()[1]
    async with RequestClient() as client:
        chunks = [c async for c in client.generate(f"127.0.0.1:{port}", request())]
    assert [(c.token_ids, c.finish_reason) for c in chunks] == [([5, 6, 7, 8], "length")]
    server.close()
    await server.wait_closed()


async def test_a_request_cancelled_in_the_same_read_as_it_started_frees_its_slot(served):
    """A ``G`` line and its ``C`` line read together: the stream's task is cancelled before it first runs
    (its coroutine never starts). Its in-flight slot and count are freed all the same, so the worker
    keeps serving ``max_inflight`` requests (the leak this guards against kept a decode leg's slot and
    the in-flight gauge forever when a frontend cancelled it at once)."""
    engine, server, client, address = served
    host, port = address.rsplit(":", 1)
    body = orjson.dumps(request("early").model_dump(exclude_defaults=True))
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(MAGIC + b"G1 " + body + b"\nC1\nG2 " + body + b"\nC2\n")
    await writer.drain()
    assert await server.wait_idle(5.0), "the cancelled streams were not forgotten"
    assert not engine.started.is_set()  # never reached the engine

    async def answer(rid: str) -> list[GenerateChunk]:
        return [c async for c in client.generate(address, request(rid))]

    answers = await asyncio.gather(answer("r0"), answer("r1"))  # max_inflight=2: both slots free
    assert [a[-1].finish_reason for a in answers] == ["length", "length"]
    writer.close()
