"""The request plane's server (``RequestServer``), what a worker runs, and its metrics.

A task per stream. A connection that closes cancels its streams, which
closes the engine's iterator, which aborts the requests. At most ``max_inflight`` streams run at once;
more are refused at once (no queue in front of the engine). ``abort_all`` ends every stream with an
error chunk of a given type (``shutting_down`` when a drain runs out of time, ``engine_died`` when the
engine died under the worker), and ``refuse`` turns new requests away with that type until ``resume``.
When the client reads slower than the worker writes, the transport's buffer fills and the streams of
that connection wait for it to drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncGenerator, Callable
from typing import cast

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import ValidationError

from dynamo_worker.protocol import ErrorType, GenerateChunk, GenerateRequest, Usage, WorkerError
from dynamo_worker.runtime.listening import binding, log_listening
from dynamo_worker.runtime.request_plane.wire import (
    _HTTP_METHODS,
    _NOT_HTTP,
    MAGIC,
    _error_chunk,
    _line,
    _Lines,
)

log = logging.getLogger(__name__)

__all__ = ["GenerateHandler", "RequestMetrics", "RequestServer"]

GenerateHandler = Callable[[GenerateRequest], AsyncGenerator[GenerateChunk, None]]


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
