"""The request plane: a frontend streams a ``GenerateRequest`` straight to a worker over HTTP/1.1.

``POST http://<address>/v1/generate`` with the request as JSON; ``200`` answers
``application/x-ndjson``, one ``GenerateChunk`` per line, the last one with ``finish_reason``.
A refusal is a non-200 status with ``{"error": {"type": ..., "message": ...}}`` (``WorkerError``):
400 ``invalid_request``, 503 ``overloaded`` / ``shutting_down``.

Server (``RequestServer``): aiohttp with ``handler_cancellation=True``, so a client that closes the
connection cancels the handler task, which closes the engine's iterator, which aborts the request.
At most ``max_inflight`` requests run at once; more are refused at once (no queue in front of the
engine). Writes wait for the socket to drain, so a slow reader slows its own stream only.

Client (``RequestClient``): one shared ``aiohttp.ClientSession`` with keep-alive. Every wait is
bounded: connecting, the first chunk, and the gap between two chunks. Lines that arrive together
are parsed in one call and their token ids handed on as one chunk (``_coalesce``). Errors::

    RequestPlaneError
    ├── WorkerUnreachable     could not connect, or the connection closed before any answer
    ├── WorkerRejected        non-200 answer; ``.error_type`` from the body (``overloaded``, ...)
    ├── WorkerTimeout         no first chunk, or no next chunk, within its bound
    └── WorkerStreamBroken    the stream ended without a final chunk, or carried an invalid line
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import TypeAdapter, ValidationError

from dynamo_worker.protocol import ErrorType, GenerateChunk, GenerateRequest, TokenLogprob, WorkerError
from dynamo_worker.runtime.listening import log_listening

__all__ = [
    "GENERATE_PATH",
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

GENERATE_PATH = "/v1/generate"
NDJSON = "application/x-ndjson"
MAX_REQUEST_BYTES = 64 * 1024 * 1024  # a 1M-token prompt as JSON ints fits easily
MAX_LINE_BYTES = 16 * 1024 * 1024  # one NDJSON line of a stream

GenerateHandler = Callable[[GenerateRequest], AsyncGenerator[GenerateChunk, None]]


# --- errors -------------------------------------------------------------------------------------


class RequestPlaneError(Exception):
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
    """The stream ended before its final chunk (the worker died mid-stream) or was not valid NDJSON."""


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
        self.duration = Histogram(
            "dynamo_worker_request_duration_seconds",
            "Time from accepting a request to its last chunk.",
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )


# --- server -------------------------------------------------------------------------------------


def _error_response(status: int, error_type: ErrorType, message: str) -> web.Response:
    body = {"error": WorkerError(type=error_type, message=message).model_dump()}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _line(chunk: GenerateChunk) -> bytes:
    """The chunk as one NDJSON line, without its default fields. A chunk of token ids only (nearly
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


class RequestServer:
    """Serves ``POST /v1/generate`` by streaming what ``handler`` yields."""

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
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._aborted: set[asyncio.Task[Any]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.draining = False
        self.port: int | None = None

    @property
    def inflight(self) -> int:
        return len(self._tasks)

    @property
    def open_connections(self) -> int:
        """Client connections currently open (kept alive between requests)."""
        server = self._runner.server if self._runner is not None else None
        return len(server.connections) if server is not None else 0

    async def start(self) -> int:
        """Listen; returns the bound port."""
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_post(GENERATE_PATH, self._generate)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, backlog=1024)
        await site.start()
        self.port = self._runner.addresses[0][1]
        log_listening("request-plane", "http", self._host, self.port)
        return self.port

    async def drain(self, grace_s: float) -> int:
        """Refuse new requests, wait up to ``grace_s`` for in-flight ones, then abort the rest (they end
        with a ``shutting_down`` error chunk). Returns how many were aborted."""
        self.draining = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await self._idle.wait()
        left = list(self._tasks)
        for task in left:
            self._aborted.add(task)
            task.cancel()
        if left:
            log.warning("Aborted in-flight requests count=%s grace_s=%s", len(left), grace_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await self._idle.wait()
        return len(left)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.requests.labels(outcome).inc()

    async def _generate(self, http_request: web.Request) -> web.StreamResponse:
        if self.draining:
            self._count("shutting_down")
            return _error_response(503, "shutting_down", "worker is shutting down; send it elsewhere")
        if len(self._tasks) >= self.max_inflight:
            self._count("overloaded")
            return _error_response(
                503, "overloaded", f"worker serves its maximum of {self.max_inflight} requests; retry later"
            )
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # reserve the slot before reading the body
        self._idle.clear()
        if self._metrics is not None:
            self._metrics.inflight.inc()
        started = time.monotonic()
        try:
            try:
                request = GenerateRequest.model_validate_json(await http_request.read())
            except ValidationError as e:
                self._count("invalid_request")
                return _error_response(400, "invalid_request", f"invalid GenerateRequest: {e}")
            return await self._stream(http_request, request, task)
        finally:
            self._tasks.discard(task)
            self._aborted.discard(task)
            if not self._tasks:
                self._idle.set()
            if self._metrics is not None:
                self._metrics.inflight.dec()
                self._metrics.duration.observe(time.monotonic() - started)

    async def _stream(
        self, http_request: web.Request, request: GenerateRequest, task: asyncio.Task[Any]
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": NDJSON})
        await response.prepare(http_request)
        outcome = "cancelled"
        tokens = 0
        try:
            async with contextlib.aclosing(self._handler(request)) as chunks:
                async for chunk in chunks:
                    await response.write(_line(chunk))
                    tokens += len(chunk.token_ids)
                    if chunk.finish_reason is not None:
                        outcome = chunk.error.type if chunk.error else chunk.finish_reason
                        break
                else:
                    outcome = "engine_error"
                    await response.write(
                        _line(_error_chunk("engine_error", "engine ended the stream without a final chunk"))
                    )
        except asyncio.CancelledError:
            if task not in self._aborted:
                log.info("Cancelled request request_id=%s (client went away)", request.request_id)
                raise
            task.uncancel()
            outcome = "shutting_down"
            await response.write(
                _line(_error_chunk("shutting_down", "worker shut down before the request finished"))
            )
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            log.info("Client went away request_id=%s", request.request_id)
            return response
        except Exception as e:  # an engine bug: map it to an error chunk for this request only
            log.exception("Engine failed request_id=%s", request.request_id)
            outcome = "engine_error"
            await response.write(_line(_error_chunk("engine_error", f"engine failed: {e}")))
        finally:
            self._count(outcome)
            if self._metrics is not None and tokens:
                self._metrics.output_tokens.inc(tokens)
        await response.write_eof()
        return response


def _error_chunk(error_type: ErrorType, message: str) -> GenerateChunk:
    return GenerateChunk(finish_reason="error", error=WorkerError(type=error_type, message=message))


# --- client -------------------------------------------------------------------------------------


class RequestClient:
    """Streams requests to workers over one shared, keep-alive ``aiohttp.ClientSession``."""

    def __init__(
        self,
        *,
        connect_timeout: float = 5.0,
        first_chunk_timeout: float = 600.0,
        idle_timeout: float = 120.0,
        max_connections: int = 0,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.first_chunk_timeout = first_chunk_timeout
        self.idle_timeout = idle_timeout
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=30.0)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None),
                read_bufsize=1024 * 1024,  # the reader's buffer; lines may be longer (MAX_LINE_BYTES)
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> RequestClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def generate(
        self,
        address: str,
        request: GenerateRequest,
        *,
        connect_timeout: float | None = None,
        first_chunk_timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> AsyncGenerator[GenerateChunk, None]:
        """Stream ``request`` to the worker at ``address`` (host:port). Ends after the final chunk.
        Closing the iterator early (or cancelling its task) closes the connection, which cancels the
        request on the worker."""
        connect_timeout = self.connect_timeout if connect_timeout is None else connect_timeout
        first_chunk_timeout = self.first_chunk_timeout if first_chunk_timeout is None else first_chunk_timeout
        idle_timeout = self.idle_timeout if idle_timeout is None else idle_timeout
        url = f"http://{address}{GENERATE_PATH}"
        body = orjson.dumps(request.model_dump(exclude_defaults=True))
        timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_connect=connect_timeout)
        session = self._get_session()
        finished, first = False, True
        response: aiohttp.ClientResponse | None = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + first_chunk_timeout
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    response = await session.post(
                        url, data=body, headers={"Content-Type": "application/json"}, timeout=timeout
                    )
            except (aiohttp.ConnectionTimeoutError, aiohttp.ClientConnectorError) as e:
                # before TimeoutError: aiohttp's connect timeout is a TimeoutError too
                raise WorkerUnreachable(address, f"could not connect: {e or type(e).__name__}") from None
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                raise WorkerUnreachable(address, f"connection closed before an answer: {e!r}") from None
            except TimeoutError:
                raise WorkerTimeout(address, f"no answer within {first_chunk_timeout:.1f}s") from None
            if response.status != 200:
                raise await _rejected(address, response)
            no_first = f"worker sent no first chunk within {first_chunk_timeout:.1f}s"
            no_next = f"worker sent no next chunk within {idle_timeout:.1f}s"
            reads = _ReadBound(response.content, address)
            partial = b""  # the start of a line whose end has not arrived yet
            try:
                while True:
                    if first:
                        reads.start(deadline, no_first)
                    else:
                        reads.start(loop.time() + idle_timeout, no_next)
                    try:
                        data = await response.content.readany()  # all that has arrived: 1+ lines
                    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ValueError) as e:
                        raise WorkerStreamBroken(address, f"stream broke mid-response: {e}") from None
                    finally:
                        reads.stop()
                    if not data:
                        raise WorkerStreamBroken(address, "stream ended without a final chunk (worker died?)")
                    *lines, partial = (partial + data).split(b"\n")
                    if len(partial) > MAX_LINE_BYTES:
                        raise WorkerStreamBroken(
                            address, f"a line of the stream exceeds {MAX_LINE_BYTES} bytes"
                        )
                    lines = [line for line in lines if line]
                    if not lines:
                        continue
                    first = False
                    try:
                        chunks = _parse(lines)
                    except (ValidationError, ValueError) as e:
                        raise WorkerStreamBroken(address, f"invalid chunk from worker: {e}") from None
                    for chunk in _coalesce(chunks):
                        finished = chunk.finish_reason is not None
                        yield chunk
                        if finished:
                            return
            finally:
                reads.close()
        finally:
            if response is not None:
                if finished:
                    response.release()
                else:
                    response.close()


_CHUNKS = TypeAdapter(list[GenerateChunk])


def _parse(lines: list[bytes]) -> list[GenerateChunk]:
    """The chunks of NDJSON ``lines``. Several lines of token ids only (what a worker sends mid-stream)
    become one chunk at once: validating one chunk costs about as much as parsing ten lines, and
    ``_coalesce`` would join them anyway."""
    data = b"[" + b",".join(lines) + b"]"
    if len(lines) > 1:
        parsed = orjson.loads(data)
        if all(_is_token_only(d) for d in parsed):
            return [GenerateChunk(token_ids=[t for d in parsed for t in d["token_ids"]])]
    return _CHUNKS.validate_json(data)


def _is_token_only(line: object) -> bool:
    return type(line) is dict and len(line) == 1 and type(line.get("token_ids")) is list


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


class _ReadBound:
    """Bounds each wait for the next line of a stream with one lazily re-armed timer instead of a timer
    per line (creating and cancelling one per chunk took about a tenth of the frontend's time per token).
    ``start(until, message)`` before a read, ``stop()`` after it; a read still waiting at ``until`` fails
    with ``WorkerTimeout(message)``. Time the caller spends between reads is never counted."""

    def __init__(self, content: aiohttp.StreamReader, address: str) -> None:
        self._content, self._address = content, address
        self._loop = asyncio.get_running_loop()
        self._until: float | None = None  # deadline of the read in progress; None between reads
        self._message = ""
        self._timer: asyncio.TimerHandle | None = None

    def start(self, until: float, message: str) -> None:
        self._until, self._message = until, message
        if self._timer is None or self._timer.when() > until:
            self.close()
            self._timer = self._loop.call_at(until, self._check)

    def stop(self) -> None:
        self._until = None

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        if self._until is None:
            return  # fired between reads: the next start() arms it again
        if self._loop.time() < self._until:
            self._timer = self._loop.call_at(self._until, self._check)  # the read began after arming
            return
        self._content.set_exception(WorkerTimeout(self._address, self._message))


async def _rejected(address: str, response: aiohttp.ClientResponse) -> WorkerRejected:
    status = response.status
    try:
        async with asyncio.timeout(5.0):
            raw = await response.read()
        error = WorkerError.model_validate(orjson.loads(raw)["error"])
        return WorkerRejected(address, status, error.type, error.message)
    except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, TypeError, ValidationError):
        return WorkerRejected(address, status, "engine_error", f"HTTP {status} {response.reason}")
    finally:
        response.release()
