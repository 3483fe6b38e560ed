"""The request plane's client (``RequestClient``), what a frontend streams requests through.

Every wait is bounded: connecting, the first chunk, and the gap between
two chunks. Chunks of one stream that arrive together are handed on as one (``_coalesce``). A
connection with no stream for ``keepalive_s`` is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncGenerator, Callable
from typing import cast

import orjson
from pydantic import ValidationError

from dynamo_worker.protocol import GenerateChunk, GenerateRequest, TokenLogprob, WorkerError
from dynamo_worker.runtime.request_plane.wire import (
    MAGIC,
    RequestPlaneError,
    WorkerRejected,
    WorkerStreamBroken,
    WorkerTimeout,
    WorkerUnreachable,
    _Lines,
)

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_FIRST_TOKEN_TIMEOUT_S",
    "DEFAULT_INTER_TOKEN_TIMEOUT_S",
    "RequestClient",
]

# The client's bounds (the frontend's --connect-timeout-s, --first-token-timeout-s, --inter-token-timeout-s)
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_FIRST_TOKEN_TIMEOUT_S = 300.0
DEFAULT_INTER_TOKEN_TIMEOUT_S = 60.0


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
