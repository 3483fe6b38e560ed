"""The request plane: a frontend streams ``GenerateRequest``s straight to a worker over one TCP connection.

Many requests share a connection (a frontend process keeps one per worker), each a numbered stream.
After connecting, the client sends ``MAGIC``; then every message is one line (JSON never holds a raw
newline)::

    client -> worker   G<id> <GenerateRequest JSON>     start stream <id> (the client numbers them)
                       C<id>                            cancel it (the caller went away)
    worker -> client   D<id> <GenerateChunk JSON>       a chunk; the one with finish_reason ends <id>
                       R<id> <status> <WorkerError>     refused before it started; ends <id>

Refusals: 400 ``invalid_request``, 503 ``overloaded`` / ``shutting_down`` / ``engine_died``. A worker
writes what its streams produced in one event-loop turn with one send, and a client parses what one
receive brought in one call, so the cost of a token does not include a system call or an HTTP frame of
its own (the reason this is not HTTP: one HTTP stream per request cost about twice the CPU per token).
Anything that connects without ``MAGIC`` is answered (an HTTP client gets a ``400`` saying what the port
is) and disconnected.

Server (``RequestServer``): a task per stream. A connection that closes cancels its streams, which
closes the engine's iterator, which aborts the requests. At most ``max_inflight`` streams run at once;
more are refused at once (no queue in front of the engine). ``abort_all`` ends every stream with an
error chunk of a given type (``shutting_down`` when a drain runs out of time, ``engine_died`` when the
engine died under the worker), and ``refuse`` turns new requests away with that type until ``resume``.
When the client reads slower than the worker writes, the transport's buffer fills and the streams of
that connection wait for it to drain.

Client (``RequestClient``): every wait is bounded: connecting, the first chunk, and the gap between
two chunks. Chunks of one stream that arrive together are handed on as one (``_coalesce``). A
connection with no stream for ``keepalive_s`` is closed. Errors::

    RequestPlaneError
    ├── WorkerUnreachable     could not connect, or the connection closed before any answer
    ├── WorkerRejected        refused; ``.error_type`` says why (``overloaded``, ...)
    ├── WorkerTimeout         no first chunk, or no next chunk, within its bound
    └── WorkerStreamBroken    the connection closed before the final chunk, or carried an invalid line
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
from collections.abc import AsyncGenerator, Callable
from typing import cast

import orjson
from dynamo_api.errors import DynamoError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import ValidationError

from dynamo_worker.protocol import ErrorType, GenerateChunk, GenerateRequest, TokenLogprob, Usage, WorkerError
from dynamo_worker.runtime.listening import binding, log_listening

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_FIRST_TOKEN_TIMEOUT_S",
    "DEFAULT_INTER_TOKEN_TIMEOUT_S",
    "MAGIC",
    "RequestClient",
    "RequestMetrics",
    "RequestPlaneError",
    "RequestServer",
    "WorkerRejected",
    "WorkerStreamBroken",
    "WorkerTimeout",
    "WorkerUnreachable",
]

log = logging.getLogger(__name__)

MAGIC = b"DYNAMO-REQUEST-PLANE/1\n"
# The client's bounds (the frontend's --connect-timeout-s, --first-token-timeout-s, --inter-token-timeout-s)
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_FIRST_TOKEN_TIMEOUT_S = 300.0
DEFAULT_INTER_TOKEN_TIMEOUT_S = 60.0
MAX_LINE_BYTES = 64 * 1024 * 1024  # one message: a 1M-token prompt as JSON ints fits easily
_HTTP_METHODS = (b"GET ", b"POST", b"PUT ", b"HEAD", b"DELE", b"OPTI", b"PATC")
_NOT_HTTP = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
    b"This port is a Dynamo worker's request plane (a framed TCP protocol, not HTTP): send requests "
    b"through the frontend's OpenAI API; the worker's /health and /metrics are on its system port.\n"
)

GenerateHandler = Callable[[GenerateRequest], AsyncGenerator[GenerateChunk, None]]


# --- errors -------------------------------------------------------------------------------------


class RequestPlaneError(DynamoError):
    """A request to a worker failed; ``address`` names the worker."""

    def __init__(self, address: str, message: str) -> None:
        super().__init__(f"{message} (worker {address})")
        self.address = address


class WorkerUnreachable(RequestPlaneError):
    """Nothing answered at the address: the worker is gone or not yet listening. Safe to retry."""


class WorkerRejected(RequestPlaneError):
    """The worker answered with a non-200 status; ``error_type`` says why (``overloaded``, ...)."""

    def __init__(self, address: str, status: int, error_type: ErrorType, message: str) -> None:
        super().__init__(address, f"worker refused the request ({status} {error_type}): {message}")
        self.status = status
        self.error_type = error_type
        self.detail = message


class WorkerTimeout(RequestPlaneError):
    """The worker sent nothing within a bound (first chunk or between chunks)."""


class WorkerStreamBroken(RequestPlaneError):
    """The stream ended before its final chunk (the worker died mid-stream) or carried an invalid line."""


# --- metrics ------------------------------------------------------------------------------------


class RequestMetrics:
    """Prometheus metrics of the request-plane server, registered in the process's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "dynamo_worker_requests",
            "Requests by outcome (finish reason, or the refusal's error type).",
            ["outcome"],
            registry=registry,
        )
        self.inflight = Gauge("dynamo_worker_inflight_requests", "Requests being served.", registry=registry)
        self.output_tokens = Counter(
            "dynamo_worker_output_tokens", "Tokens streamed to clients.", registry=registry
        )
        self.cached_tokens = Counter(
            "dynamo_worker_cached_tokens",
            "Prompt tokens the engine did not compute, by the KV tier they were found in: gpu, or host "
            "(loaded back from host memory or storage, SGLang's HiCache).",
            ["tier"],
            registry=registry,
        )
        self.duration = Histogram(
            "dynamo_worker_request_duration_seconds",
            "Time from accepting a request to its last chunk.",
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )

    def count_cached(self, usage: Usage) -> None:
        host = min(usage.cached_tokens_host, usage.cached_tokens)
        if usage.cached_tokens - host:
            self.cached_tokens.labels("gpu").inc(usage.cached_tokens - host)
        if host:
            self.cached_tokens.labels("host").inc(host)


# --- framing ------------------------------------------------------------------------------------


class _Lines:
    """Splits a byte stream into lines. A line longer than ``MAX_LINE_BYTES`` raises ``ValueError``."""

    __slots__ = ("_parts", "_size")

    def __init__(self) -> None:
        self._parts: list[bytes] = []  # the start of a line whose end has not arrived yet
        self._size = 0

    def feed(self, data: bytes) -> list[bytes]:
        if b"\n" not in data:
            self._parts.append(data)
            self._size += len(data)
            if self._size > MAX_LINE_BYTES:
                raise ValueError(f"a message exceeds {MAX_LINE_BYTES} bytes")
            return []
        if self._parts:
            data = b"".join(self._parts) + data
            self._parts.clear()
        *lines, rest = data.split(b"\n")
        self._size = len(rest)
        if rest:
            if self._size > MAX_LINE_BYTES:
                raise ValueError(f"a message exceeds {MAX_LINE_BYTES} bytes")
            self._parts.append(rest)
        return lines


def _line(chunk: GenerateChunk) -> bytes:
    """The chunk as one line of JSON without its default fields. A chunk of token ids only (nearly
    every line) is written directly, as pydantic would write it, in a third of the time."""
    if (
        chunk.token_ids
        and chunk.finish_reason is None  # and so no error either
        and chunk.usage is None
        and chunk.logprobs is None
        and chunk.embeddings is None
    ):
        return b'{"token_ids":' + orjson.dumps(chunk.token_ids) + b"}\n"
    return chunk.__pydantic_serializer__.to_json(chunk, exclude_defaults=True) + b"\n"


def _error_chunk(error_type: ErrorType, message: str) -> GenerateChunk:
    return GenerateChunk(finish_reason="error", error=WorkerError(type=error_type, message=message))


# --- server -------------------------------------------------------------------------------------


class _ServerConnection(asyncio.Protocol):
    """One client's connection to a ``RequestServer``: its streams, and what they wrote this turn."""

    def __init__(self, server: RequestServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.greeting = b""  # until it is MAGIC
        self.greeted = False
        self.lines = _Lines()
        self.streams: dict[bytes, asyncio.Task[None]] = {}
        self.out: list[bytes] = []
        self.flush_soon = False
        self.writable = asyncio.Event()
        self.writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self.server._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._connections.discard(self)
        for task in self.streams.values():
            task.cancel()  # the client went away
        self.writable.set()  # streams waiting for the buffer to drain run into their cancellation

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            return  # refused: what still arrives is dropped
        if not self.greeted:
            data = self._greet(data)
            if not data:
                return
        try:
            lines = self.lines.feed(data)
        except ValueError as e:
            self.refuse_connection(str(e))
            return
        for line in lines:
            if line:
                self.server._message(self, line)

    def _greet(self, data: bytes) -> bytes:
        """What follows ``MAGIC`` once it has arrived; b"" while it has not or when it did not come."""
        greeting = self.greeting + data
        if greeting.startswith(MAGIC):
            self.greeted, self.greeting = True, b""
            return greeting[len(MAGIC) :]
        if MAGIC.startswith(greeting):
            self.greeting = greeting
            return b""
        assert self.transport is not None
        if greeting.startswith(_HTTP_METHODS):
            self.transport.write(_NOT_HTTP)
        peer = self.transport.get_extra_info("peername")
        log.warning("Closed a connection that does not speak the request plane peer=%s", peer)
        self.transport.close()
        return b""

    def refuse_connection(self, message: str) -> None:
        assert self.transport is not None
        log.warning("Closed a request-plane connection: %s", message)
        self.transport.abort()

    def send(self, data: bytes) -> None:
        """Queue ``data`` for the one write of this event-loop turn."""
        self.out.append(data)
        if not self.flush_soon:
            self.flush_soon = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_soon = False
        assert self.transport is not None
        if not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()


class RequestServer:
    """Serves the request plane by streaming what ``handler`` yields for each request."""

    def __init__(
        self,
        handler: GenerateHandler,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_inflight: int = 1024,
        metrics: RequestMetrics | None = None,
    ) -> None:
        self._handler = handler
        self._host = host
        self._port = port
        self.max_inflight = max_inflight
        self._metrics = metrics
        self._server: asyncio.Server | None = None
        self._connections: set[_ServerConnection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._aborted: dict[asyncio.Task[None], WorkerError] = {}  # task -> the error chunk it ends with
        self._ran: set[asyncio.Task[None]] = set()  # tasks whose ``_serve`` started (and counts its outcome)
        self._idle = asyncio.Event()
        self._idle.set()
        self.draining = False
        self.refusal: WorkerError | None = None  # set: new requests are refused (503) with this error
        self.port: int | None = None

    @property
    def inflight(self) -> int:
        return len(self._tasks)

    @property
    def open_connections(self) -> int:
        """Client connections currently open."""
        return len(self._connections)

    async def start(self) -> int:
        """Listen; returns the bound port."""
        loop = asyncio.get_running_loop()
        with binding("the request plane", "--request-port", self._host, self._port):
            self._server = await loop.create_server(
                lambda: _ServerConnection(self), self._host, self._port, backlog=1024
            )
        self.port = self._server.sockets[0].getsockname()[1]
        log_listening("request-plane", "tcp", self._host, self.port)
        return self.port

    async def drain(self, grace_s: float) -> int:
        """Refuse new requests, wait up to ``grace_s`` for in-flight ones, then abort the rest (they end
        with a ``shutting_down`` error chunk). Returns how many were aborted."""
        self.draining = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await self._idle.wait()
        left = self.abort_all("shutting_down", "worker shut down before the request finished")
        if left:
            log.warning("Aborted in-flight requests count=%s grace_s=%s", left, grace_s)
            await self.wait_idle(5.0)
        return left

    def refuse(self, error_type: ErrorType, message: str) -> None:
        """Refuse every new request with 503 ``error_type`` until ``resume``."""
        self.refusal = WorkerError(type=error_type, message=message)

    def resume(self) -> None:
        self.refusal = None

    def abort_all(self, error_type: ErrorType, message: str) -> int:
        """End every in-flight stream now with an error chunk of ``error_type`` (each engine iterator is
        closed, which aborts its request in the engine). Returns how many there were."""
        error = WorkerError(type=error_type, message=message)
        left = [task for task in self._tasks if task not in self._aborted]
        for task in left:
            self._aborted[task] = error
            task.cancel()
        return len(left)

    async def wait_idle(self, within_s: float) -> bool:
        """Wait up to ``within_s`` until no stream is open; whether none is."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within_s):
                await self._idle.wait()
        return not self._tasks

    async def stop(self) -> None:
        """Stop listening and close every connection (what was written is still sent)."""
        if self._server is not None:
            self._server.close()
            for conn in list(self._connections):
                if conn.transport is not None:
                    conn.transport.close()
            await self._server.wait_closed()
            self._server = None

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.requests.labels(outcome).inc()

    def _message(self, conn: _ServerConnection, line: bytes) -> None:
        head, _, body = line.partition(b" ")
        kind, sid = head[:1], head[1:]
        if not sid.isdigit():
            conn.refuse_connection(f"invalid message {line[:40]!r}")
        elif kind == b"G":
            self._open(conn, sid, body)
        elif kind == b"C":
            task = conn.streams.get(sid)
            if task is not None:
                task.cancel()
        else:
            conn.refuse_connection(f"invalid message {line[:40]!r}")

    def _refuse(
        self, conn: _ServerConnection, sid: bytes, status: int, error: ErrorType, message: str
    ) -> None:
        self._count(error)
        body = orjson.dumps(WorkerError(type=error, message=message).model_dump())
        conn.send(b"R%s %d %s\n" % (sid, status, body))

    def _open(self, conn: _ServerConnection, sid: bytes, body: bytes) -> None:
        if self.draining:
            self._refuse(conn, sid, 503, "shutting_down", "worker is shutting down; send it elsewhere")
            return
        if self.refusal is not None:
            self._refuse(conn, sid, 503, self.refusal.type, self.refusal.message)
            return
        if len(self._tasks) >= self.max_inflight:
            message = f"worker serves its maximum of {self.max_inflight} requests; retry later"
            self._refuse(conn, sid, 503, "overloaded", message)
            return
        if sid in conn.streams:
            self._refuse(conn, sid, 400, "invalid_request", f"stream {sid.decode()} is already open")
            return
        try:
            request = GenerateRequest.model_validate_json(body)
        except ValidationError as e:
            self._refuse(conn, sid, 400, "invalid_request", f"invalid GenerateRequest: {e}")
            return
        task = conn.loop.create_task(self._serve(conn, sid, request))
        # Bookkeeping in a done callback, not in ``_serve``'s ``finally``: a task cancelled before it first
        # runs (a C line read with its G line) never enters its coroutine, so no ``finally`` would run.
        task.add_done_callback(functools.partial(self._ended, conn, sid))
        conn.streams[sid] = task
        self._tasks.add(task)
        self._idle.clear()
        if self._metrics is not None:
            self._metrics.inflight.inc()

    async def _serve(self, conn: _ServerConnection, sid: bytes, request: GenerateRequest) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._ran.add(task)
        started = time.monotonic()
        prefix = b"D" + sid + b" "
        outcome = "cancelled"
        tokens = 0
        try:
            async with contextlib.aclosing(self._handler(request)) as chunks:
                async for chunk in chunks:
                    conn.send(prefix + _line(chunk))
                    tokens += len(chunk.token_ids)
                    if chunk.finish_reason is not None:
                        outcome = chunk.error.type if chunk.error else chunk.finish_reason
                        if chunk.usage is not None and self._metrics is not None:
                            self._metrics.count_cached(chunk.usage)
                        break
                    if not conn.writable.is_set():
                        await conn.writable.wait()  # the client reads slower than we write
                else:
                    outcome = "engine_error"
                    error = _error_chunk("engine_error", "engine ended the stream without a final chunk")
                    conn.send(prefix + _line(error))
        except asyncio.CancelledError:
            aborted = self._aborted.get(task)
            if aborted is None:
                log.info("Cancelled request request_id=%s (client went away)", request.request_id)
                raise
            task.uncancel()
            outcome = aborted.type
            conn.send(prefix + _line(_error_chunk(aborted.type, aborted.message)))
        except Exception as e:  # an engine bug: map it to an error chunk for this request only
            log.exception("Engine failed request_id=%s", request.request_id)
            outcome = "engine_error"
            conn.send(prefix + _line(_error_chunk("engine_error", f"engine failed: {e}")))
        finally:
            self._count(outcome)
            if self._metrics is not None:
                self._metrics.duration.observe(time.monotonic() - started)
                if tokens:
                    self._metrics.output_tokens.inc(tokens)

    def _ended(self, conn: _ServerConnection, sid: bytes, task: asyncio.Task[None]) -> None:
        """Forget a stream whose task is done, also one cancelled before it ran (counted as cancelled)."""
        if conn.streams.get(sid) is task:
            del conn.streams[sid]
        self._tasks.discard(task)
        self._aborted.pop(task, None)
        if not self._tasks:
            self._idle.set()
        if task.cancelled() and task not in self._ran:
            self._count("cancelled")
        self._ran.discard(task)
        if self._metrics is not None:
            self._metrics.inflight.dec()


# --- client -------------------------------------------------------------------------------------


class _Stream:
    """One request's chunks as they arrive, for the task that reads them. ``take`` waits with one lazily
    re-armed timer per stream, not a timer per wait: a reader that keeps up finds chunks waiting and
    arms none."""

    __slots__ = (
        "address",
        "answered",
        "chunks",
        "error",
        "expired",
        "loop",
        "refused",
        "timer",
        "until",
        "waiter",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, address: str) -> None:
        self.loop = loop
        self.address = address
        self.chunks: list[GenerateChunk] = []
        self.error: RequestPlaneError | None = None
        self.answered = False  # a chunk came
        self.refused = False  # the worker ended the stream with a refusal
        self.waiter: asyncio.Future[None] | None = None
        self.until: float | None = None  # deadline of the wait in progress; None between waits
        self.expired = False
        self.timer: asyncio.TimerHandle | None = None

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, error: RequestPlaneError) -> None:
        if self.error is None:
            self.error = error
        self.wake()

    async def take(self, until: float, message: str) -> list[GenerateChunk]:
        """The chunks that arrived since the last take, waiting for one until ``until`` (loop time)."""
        while not self.chunks:
            if self.error is not None:
                raise self.error
            if self.expired:
                raise WorkerTimeout(self.address, message)
            self.until = until
            if self.timer is None or self.timer.when() > until:
                self.close()
                self.timer = self.loop.call_at(until, self._check)
            self.waiter = self.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter, self.until = None, None
        chunks, self.chunks = self.chunks, []
        return chunks

    def _check(self) -> None:
        self.timer = None
        if self.until is None:
            return  # fired between waits: the next wait arms it again
        if self.loop.time() < self.until:
            self.timer = self.loop.call_at(self.until, self._check)  # the wait began after arming
            return
        self.expired = True
        self.wake()

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class _ClientConnection(asyncio.Protocol):
    """A connection to one worker, carrying the streams of many requests."""

    def __init__(self, address: str, keepalive_s: float, forget: Callable[[_ClientConnection], None]) -> None:
        self.address = address
        self.keepalive_s = keepalive_s
        self.forget = forget
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.lines = _Lines()
        self.streams: dict[bytes, _Stream] = {}
        self.next_id = 0
        self.lost = False
        self.idle_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        sock = transport.get_extra_info("socket")
        with contextlib.suppress(OSError, AttributeError):  # notice a worker host that vanished
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
        self.transport.write(MAGIC)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.forget(self)
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        for stream in self.streams.values():
            if stream.answered:
                stream.fail(
                    WorkerStreamBroken(
                        self.address, "the connection closed before the final chunk (worker died?)"
                    )
                )
            else:
                stream.fail(WorkerUnreachable(self.address, "the connection closed before an answer"))

    def data_received(self, data: bytes) -> None:
        try:
            lines = self.lines.feed(data)
        except ValueError as e:
            self._broken(str(e))
            return
        ids: list[bytes] = []
        bodies: list[bytes] = []
        for line in lines:
            head, _, body = line.partition(b" ")
            if head[:1] == b"D":
                ids.append(head[1:])
                bodies.append(body)
            elif head[:1] == b"R":
                self._refused(head[1:], body)
            elif line:
                self._broken(f"invalid message from worker: {line[:80]!r}")
                return
        if bodies:
            self._deliver(ids, bodies)

    def _deliver(self, ids: list[bytes], bodies: list[bytes]) -> None:
        """Hand the chunk lines that arrived together to their streams. A stream's run of lines of token
        ids only (what a worker sends mid-stream) becomes one chunk without a model per line:
        validating a chunk costs about as much as parsing ten lines, and ``_coalesce`` would join
        them anyway. A line that does not validate breaks its own stream only."""
        try:
            parsed: list[object] = orjson.loads(b"[" + b",".join(bodies) + b"]")
        except orjson.JSONDecodeError:
            parsed = [None] * len(bodies)  # some line is not JSON: validate each on its own
        runs: dict[bytes, list[list[int] | bytes]] = {}  # per stream: id runs and other lines, in order
        for sid, body, line in zip(ids, bodies, parsed, strict=True):
            if sid not in self.streams:
                continue  # cancelled here, and the worker had not heard yet
            items = runs.setdefault(sid, [])
            if type(line) is dict and len(line) == 1 and type(line.get("token_ids")) is list:
                last = items[-1] if items else None
                if isinstance(last, list):
                    last.extend(line["token_ids"])
                else:
                    items.append(list(line["token_ids"]))
            else:
                items.append(body)
        for sid, items in runs.items():
            stream = self.streams[sid]
            if stream.error is not None:
                continue
            try:
                stream.chunks += [
                    GenerateChunk(token_ids=item)
                    if isinstance(item, list)
                    else GenerateChunk.model_validate_json(item)
                    for item in items
                ]
            except ValidationError as e:
                stream.fail(WorkerStreamBroken(self.address, f"invalid chunk from worker: {e}"))
                continue
            stream.answered = True
            stream.wake()

    def _refused(self, sid: bytes, body: bytes) -> None:
        stream = self.streams.get(sid)
        if stream is None:
            return
        stream.refused = True
        status_text, _, error_json = body.partition(b" ")
        status = int(status_text) if status_text.isdigit() else 500
        try:
            error = WorkerError.model_validate_json(error_json)
            stream.fail(WorkerRejected(self.address, status, error.type, error.message))
        except ValidationError:
            stream.fail(WorkerRejected(self.address, status, "engine_error", f"refused with status {status}"))

    def _broken(self, message: str) -> None:
        for stream in self.streams.values():
            stream.fail(WorkerStreamBroken(self.address, message))
        assert self.transport is not None
        self.transport.abort()

    def open(self, request: bytes) -> tuple[bytes, _Stream]:
        """Start a stream carrying ``request`` (JSON)."""
        assert self.transport is not None
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        self.next_id += 1
        sid = b"%d" % self.next_id
        stream = self.streams[sid] = _Stream(self.loop, self.address)
        self.transport.write(b"G" + sid + b" " + request + b"\n")
        return sid, stream

    def close_stream(self, sid: bytes, cancel: bool) -> None:
        """Forget stream ``sid``; with ``cancel``, tell the worker to stop it."""
        stream = self.streams.pop(sid, None)
        if stream is not None:
            stream.close()
        if self.lost:
            return
        assert self.transport is not None
        if cancel:
            self.transport.write(b"C" + sid + b"\n")
        if not self.streams and self.idle_timer is None:
            self.idle_timer = self.loop.call_later(self.keepalive_s, self._close_if_idle)

    def _close_if_idle(self) -> None:
        self.idle_timer = None
        if not self.streams and self.transport is not None:
            self.lost = True  # from now on a new request opens a new connection
            self.forget(self)
            self.transport.close()


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class RequestClient:
    """Streams requests to workers, one connection per worker shared by all requests to it."""

    def __init__(
        self,
        *,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        first_token_timeout_s: float = DEFAULT_FIRST_TOKEN_TIMEOUT_S,
        inter_token_timeout_s: float = DEFAULT_INTER_TOKEN_TIMEOUT_S,
        keepalive_s: float = 30.0,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.first_token_timeout_s = first_token_timeout_s
        self.inter_token_timeout_s = inter_token_timeout_s
        self.keepalive_s = keepalive_s
        self._connections: dict[str, _ClientConnection] = {}
        self._connecting: dict[str, asyncio.Future[_ClientConnection]] = {}

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def close(self) -> None:
        for pending in list(self._connecting.values()):
            pending.cancel()
        for conn in list(self._connections.values()):
            if conn.transport is not None:
                conn.transport.close()
        self._connections.clear()

    async def __aenter__(self) -> RequestClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _forget(self, conn: _ClientConnection) -> None:
        if self._connections.get(conn.address) is conn:
            del self._connections[conn.address]

    async def _connection(self, address: str, connect_timeout_s: float) -> _ClientConnection:
        conn = self._connections.get(address)
        if conn is not None and not conn.lost:
            return conn
        pending = self._connecting.get(address)
        if pending is None:  # one connect per worker, however many requests wait for it
            pending = asyncio.ensure_future(self._connect(address, connect_timeout_s))
            self._connecting[address] = pending
            pending.add_done_callback(lambda _: self._connecting.pop(address, None))
        return await asyncio.shield(pending)

    async def _connect(self, address: str, connect_timeout_s: float) -> _ClientConnection:
        loop = asyncio.get_running_loop()
        try:
            host, port = _host_port(address)
            async with asyncio.timeout(connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _ClientConnection(address, self.keepalive_s, self._forget), host, port
                )
        except TimeoutError:
            raise WorkerUnreachable(address, f"could not connect within {connect_timeout_s:.1f}s") from None
        except (OSError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
            raise WorkerUnreachable(address, f"could not connect: {reason}") from None
        self._connections[address] = conn
        return conn

    async def generate(
        self,
        address: str,
        request: GenerateRequest,
        *,
        connect_timeout_s: float | None = None,
        first_token_timeout_s: float | None = None,
        inter_token_timeout_s: float | None = None,
    ) -> AsyncGenerator[GenerateChunk, None]:
        """Stream ``request`` to the worker at ``address`` (host:port). Ends after the final chunk.
        Closing the iterator early (or cancelling its task) cancels the request on the worker."""
        if connect_timeout_s is None:
            connect_timeout_s = self.connect_timeout_s
        if first_token_timeout_s is None:
            first_token_timeout_s = self.first_token_timeout_s
        if inter_token_timeout_s is None:
            inter_token_timeout_s = self.inter_token_timeout_s
        loop = asyncio.get_running_loop()
        until = loop.time() + first_token_timeout_s
        message = f"worker sent no first chunk within {first_token_timeout_s:.1f}s"
        conn = await self._connection(address, connect_timeout_s)
        sid, stream = conn.open(orjson.dumps(request.model_dump(exclude_defaults=True)))
        finished = False
        try:
            while True:
                chunks = await stream.take(until, message)
                for chunk in _coalesce(chunks):
                    finished = chunk.finish_reason is not None
                    yield chunk
                    if finished:
                        return
                until = loop.time() + inter_token_timeout_s  # the caller's time between takes is not counted
                message = f"worker sent no next chunk within {inter_token_timeout_s:.1f}s"
        finally:
            conn.close_stream(sid, cancel=not finished and not stream.refused)


def _joinable(head: GenerateChunk, chunk: GenerateChunk) -> bool:
    """Whether ``chunk`` can take the tokens of ``head``, a token-only chunk before it: not an error,
    no embeddings, and logprobs on both or on neither (they stay aligned with the token ids)."""
    return (
        chunk.error is None
        and chunk.embeddings is None
        and (head.logprobs is None) == (chunk.logprobs is None)
    )


def _coalesce(chunks: list[GenerateChunk]) -> list[GenerateChunk]:
    """Chunks that arrived together, as few chunks: consecutive token-only chunks become one (their
    logprobs too), and their tokens go into the final chunk unless it is an error; chunks with
    embeddings are never joined. Nothing waits for this: a chunk that arrives alone is passed on alone;
    only a reader that fell behind sees several at once, and handing them on together saves it
    per-chunk work exactly when it is short of time. A run of joined chunks is copied once, at its
    end (copying per joined chunk cost more than the rest of the frontend's work per token)."""
    if len(chunks) == 1:
        return chunks
    out: list[GenerateChunk] = []
    head: GenerateChunk | None = None  # the first token-only chunk of the run being joined
    ids: list[int] = []  # the run's token ids (and logprobs, when it has them)
    logprobs: list[TokenLogprob] | None = None
    for chunk in chunks:
        if head is not None and _joinable(head, chunk):
            ids += chunk.token_ids
            if logprobs is not None:
                logprobs += chunk.logprobs or []
            if _token_only(chunk):
                continue
            out.append(chunk.model_copy(update={"token_ids": ids, "logprobs": logprobs}))
            head = None
        else:
            if head is not None:
                out.append(_joined(head, ids, logprobs))
            if _token_only(chunk):
                head, ids = chunk, list(chunk.token_ids)
                logprobs = None if chunk.logprobs is None else list(chunk.logprobs)
                continue
            head = None
            out.append(chunk)
        if chunk.finish_reason is not None:
            break  # a final chunk ends the stream
    if head is not None:
        out.append(_joined(head, ids, logprobs))
    return out


def _token_only(chunk: GenerateChunk) -> bool:
    return (
        chunk.finish_reason is None
        and chunk.usage is None
        and chunk.embeddings is None
        and chunk.error is None
    )


def _joined(head: GenerateChunk, ids: list[int], logprobs: list[TokenLogprob] | None) -> GenerateChunk:
    """The run that started at ``head``: ``head`` itself when it was alone."""
    if len(ids) == len(head.token_ids):
        return head
    return head.model_copy(update={"token_ids": ids, "logprobs": logprobs})
