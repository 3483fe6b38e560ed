"""Request migration: a stream whose worker is lost continues on another worker of its role.

When a worker dies, breaks its stream, stalls past the inter-token bound, says its engine died under it
(``engine_died``: the worker lives on, restarting its engine or exiting), or aborts the request while
draining, the frontend re-sends the request to another worker with the prompt plus every token already
streamed to the client (and ``max_tokens`` reduced by as many), so the client's stream goes on with
no repeat and no gap; in disaggregated serving that is a new prefill and decode pair for the extended
prompt. This happens at most ``--migration-limit`` times per request (NVIDIA Dynamo's flag). Usage
stays the client's view: the original prompt's tokens, and every token streamed, across workers.

Default 1, where Dynamo's is 0 (off): a stream cut by one lost worker (a crash, an OOM kill, a node
drain, a rolling update past its grace period) is the common failure, and finishing it costs one
prefill of prompt + generated tokens on another worker, far cheaper for a user than a broken answer.
It stays at 1 rather than more because a request that itself crashes its worker (a poison request)
then takes down at most two workers before the client gets the error. 0 turns migration off: the
client gets the error event within the failure's own bound, as before.

Refusals for the request's own sake (``invalid_request``) and engine errors are not migrated: a
second worker would fail it the same way.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Callable

from dynamo_worker.frontend.errors import ApiError, WorkerLost
from dynamo_worker.frontend.models.registry import ModelEntry
from dynamo_worker.frontend.serving.dispatch import Dispatcher
from dynamo_worker.protocol import GenerateChunk, GenerateRequest, Usage

__all__ = ["DEFAULT_MIGRATION_LIMIT", "MigratingDispatcher", "continuation"]

log = logging.getLogger(__name__)

DEFAULT_MIGRATION_LIMIT = 1


def _migratable(error: ApiError) -> bool:
    return isinstance(error, WorkerLost) or error.code == "shutting_down"


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
        migration_limit: int = DEFAULT_MIGRATION_LIMIT,
        on_migration: Callable[[str], None] | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.migration_limit = migration_limit
        self._on_migration = on_migration  # called with the model name (the frontend's metric)
        self.migrations = 0  # requests continued on another worker, since start (for /metrics)

    def __getattr__(self, name: str) -> object:  # router, quarantine, plan, ...: the dispatcher's
        return getattr(self.dispatcher, name)

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


def _client_usage(request: GenerateRequest, emitted: list[int], last: Usage | None) -> Usage:
    cached = min(last.cached_tokens, len(request.token_ids)) if last is not None else 0
    return Usage(prompt_tokens=len(request.token_ids), completion_tokens=len(emitted), cached_tokens=cached)
