"""Migration: a stream whose worker is lost goes on on another worker (``MigratingDispatcher``, the
dispatcher the frontend uses, around ``serving.dispatch.Dispatcher``).

Migration (``MigratingDispatcher``, the dispatcher the frontend uses): when a worker dies, breaks its
stream, stalls past the inter-token bound, says its engine died under it (``engine_died``: the worker lives
on, restarting its engine or exiting), or aborts the request while draining, the frontend re-sends the
request to another worker with the prompt plus every token already streamed to the client (and
``max_tokens`` reduced by as many), so the client's stream goes on with no repeat and no gap; in
disaggregated serving that is a new prefill and decode pair for the extended prompt. This happens at most
``--migration-limit`` times per request (NVIDIA Dynamo's flag). Usage stays the client's view: the original
prompt's tokens, and every token streamed, across workers.

Default 1, where Dynamo's is 0 (off): a stream cut by one lost worker (a crash, an OOM kill, a node
drain, a rolling update past its grace period) is the common failure, and finishing it costs one
prefill of prompt + generated tokens on another worker, far cheaper for a user than a broken answer.
It stays at 1 rather than more because a request that itself crashes its worker (a poison request)
then takes down at most two workers before the client gets the error. 0 turns migration off: the
client gets the error event within the failure's own bound, as before.

Refusals for the request's own sake (``invalid_request``) and engine errors are not migrated: a
second worker would fail it the same way.

A stream whose worker said its engine died (``engine_died``: the worker restarts its engine, or its pod
is restarted) and whose continuation finds no live worker of its role (the only decode worker, a
multinode group) waits for one to register, as a new request for a model with no worker does, up to
``wait_s`` (the frontend's ``--scale-up-timeout-s``), looking again at every change of the workers and at
least every ``RECHECK_S``; past it the client gets the 503 that says why. A worker that vanished (its
stream broke) gives no such sign that it comes back: that continuation gets the 503 at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable

from dynamo_worker.frontend.errors import ApiError, ServiceUnavailable, WorkerLost
from dynamo_worker.frontend.models.registry import ModelEntry
from dynamo_worker.frontend.serving.dispatch import Dispatcher
from dynamo_worker.protocol import GenerateChunk, GenerateRequest, Usage

log = logging.getLogger(__name__)

__all__ = ["RECHECK_S", "MigratingDispatcher", "continuation"]

RECHECK_S = 1.0  # a continuation waiting for a worker looks again at least this often
# 503s that say no worker of the role can take the request now (``Dispatcher.route``)
_NO_WORKER = frozenset({"no_workers", "no_prefill_workers", "no_decode_workers", "no_matching_revision"})


def _migratable(error: ApiError) -> bool:
    return isinstance(error, WorkerLost) or error.code == "shutting_down"


def _no_worker(error: ApiError) -> bool:
    return isinstance(error, ServiceUnavailable) and error.code in _NO_WORKER


def continuation(request: GenerateRequest, emitted: list[int], migration: int) -> GenerateRequest:
    """The request that continues ``request`` after ``emitted`` tokens reached the client."""
    stop = request.stop.model_copy(
        update={
            "max_tokens": request.stop.max_tokens - len(emitted),
            "min_tokens": max(0, request.stop.min_tokens - len(emitted)),
        }
    )
    return request.model_copy(
        update={
            "request_id": f"{request.request_id}-m{migration}",
            "token_ids": [*request.token_ids, *emitted],
            "stop": stop,
        }
    )


class MigratingDispatcher:
    """``Dispatcher.generate`` with migration: the same interface, one uninterrupted stream."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        migration_limit: int,  # --migration-limit (frontend.settings)
        on_migration: Callable[[str], None] | None = None,
        *,
        wait_s: float = 0.0,
        workers_changed: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.migration_limit = migration_limit
        self._on_migration = on_migration  # called with the model name (the frontend's metric)
        self.migrations = 0  # requests continued on another worker, since start (for /metrics)
        self.wait_s = wait_s  # how long a continuation waits for a worker of its role
        self._workers_changed = workers_changed

    async def generate(
        self, entry: ModelEntry, request: GenerateRequest
    ) -> AsyncGenerator[GenerateChunk, None]:
        if self.migration_limit == 0:
            async with contextlib.aclosing(self.dispatcher.generate(entry, request)) as chunks:
                async for chunk in chunks:
                    yield chunk
            return
        emitted: list[int] = []
        current, migrations = request, 0
        waiting_until: float | None = None  # a continuation waiting for a worker of its role
        error: ApiError | None = None  # why the stream was last migrated
        while True:
            try:
                async with contextlib.aclosing(self.dispatcher.generate(entry, current)) as chunks:
                    async for chunk in chunks:
                        if chunk.token_ids:
                            emitted.extend(chunk.token_ids)
                        if migrations and chunk.usage is not None:
                            chunk = chunk.model_copy(
                                update={"usage": _client_usage(request, emitted, chunk.usage)}
                            )
                        yield chunk
                return
            except ApiError as e:
                if migrations and _no_worker(e) and error is not None and error.code == "engine_died":
                    waiting_until = await self._wait_for_worker(request, e, waiting_until)
                    continue
                if not _migratable(e) or migrations >= self.migration_limit:
                    raise
                error = e
            migrations += 1
            self.migrations += 1
            if self._on_migration is not None:
                self._on_migration(request.model)
            if len(emitted) >= request.stop.max_tokens:  # lost after the last token, before the final chunk
                yield GenerateChunk(finish_reason="length", usage=_client_usage(request, emitted, None))
                return
            log.warning(
                "Migrating request request_id=%s migration=%d/%d tokens_streamed=%d reason=%s",
                request.request_id,
                migrations,
                self.migration_limit,
                len(emitted),
                error.message,
            )
            current = continuation(request, emitted, migrations)

    async def _wait_for_worker(self, request: GenerateRequest, error: ApiError, until: float | None) -> float:
        """Wait for the workers to change (or ``RECHECK_S``) before the continuation is tried again;
        raise ``error`` once ``wait_s`` has passed since the first time it found no worker."""
        loop = asyncio.get_running_loop()
        if until is None:
            until = loop.time() + self.wait_s
            log.warning(
                "Migration waits for a worker request_id=%s wait_s=%.0f reason=%s",
                request.request_id,
                self.wait_s,
                error.message,
            )
        left = until - loop.time()
        if left <= 0:
            raise error
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(RECHECK_S, left)):
                if self._workers_changed is not None:
                    await self._workers_changed()
                else:
                    await asyncio.sleep(RECHECK_S)
        return until


def _client_usage(request: GenerateRequest, emitted: list[int], last: Usage | None) -> Usage:
    cached = min(last.cached_tokens, len(request.token_ids)) if last is not None else 0
    return Usage(prompt_tokens=len(request.token_ids), completion_tokens=len(emitted), cached_tokens=cached)
