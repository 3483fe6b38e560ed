"""The request plane: a frontend streams ``GenerateRequest``s straight to a worker over one TCP connection.

Many requests share a connection (a frontend process keeps one per worker), each a numbered stream.
After connecting, the client sends ``MAGIC``; then every message is one line (JSON never holds a raw
newline; ``wire``)::

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

Server (``RequestServer``, ``server``): a task per stream. A connection that closes cancels its streams, which
closes the engine's iterator, which aborts the requests. At most ``max_inflight`` streams run at once;
more are refused at once (no queue in front of the engine). ``abort_all`` ends every stream with an
error chunk of a given type (``shutting_down`` when a drain runs out of time, ``engine_died`` when the
engine died under the worker), and ``refuse`` turns new requests away with that type until ``resume``.
When the client reads slower than the worker writes, the transport's buffer fills and the streams of
that connection wait for it to drain.

Client (``RequestClient``, ``client``): every wait is bounded: connecting, the first chunk, and the gap
between two chunks. Chunks of one stream that arrive together are handed on as one (``_coalesce``). A
connection with no stream for ``keepalive_s`` is closed. Errors (``wire``)::

    RequestPlaneError
    ├── WorkerUnreachable     could not connect, or the connection closed before any answer
    ├── WorkerRejected        refused; ``.error_type`` says why (``overloaded``, ...)
    ├── WorkerTimeout         no first chunk, or no next chunk, within its bound
    └── WorkerStreamBroken    the connection closed before the final chunk, or carried an invalid line
"""

from dynamo_worker.runtime.request_plane.client import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_FIRST_TOKEN_TIMEOUT_S,
    DEFAULT_INTER_TOKEN_TIMEOUT_S,
    RequestClient,
)
from dynamo_worker.runtime.request_plane.server import RequestMetrics, RequestServer
from dynamo_worker.runtime.request_plane.wire import (
    MAGIC,
    RequestPlaneError,
    WorkerRejected,
    WorkerStreamBroken,
    WorkerTimeout,
    WorkerUnreachable,
)

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
