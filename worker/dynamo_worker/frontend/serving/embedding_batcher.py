"""Serving an embedding job (``requests.embeddings``): its vectors from a worker, answered in OpenAI's
shape (``float`` lists, or ``base64`` as the wire already carries them).

Batching (``EmbeddingBatcher``): requests of the same model and ``dimensions`` that arrive within
``window_s`` of each other are sent to one worker as one request (SGLang batches a list of inputs in
one forward pass), up to ``max_inputs`` inputs and ``max_tokens`` tokens; a request that alone reaches
a bound goes by itself at once. A client that goes away leaves its batch running for the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass

from dynamo_worker.frontend.errors import ApiError, UpstreamError
from dynamo_worker.frontend.models.registry import ModelEntry
from dynamo_worker.frontend.serving.dispatch import ChunkSource
from dynamo_worker.protocol import EmbedOptions, GenerateRequest, StopConditions
from dynamo_worker.runtime.aio import cancel_and_wait

log = logging.getLogger(__name__)

__all__ = ["EmbeddingBatcher"]


@dataclass
class _Waiting:
    inputs: list[list[int]]
    future: asyncio.Future[list[str]]


class EmbeddingBatcher:
    def __init__(
        self,
        dispatcher: ChunkSource,
        *,
        window_s: float = 0.002,
        max_inputs: int = 64,
        max_tokens: int = 8192,
    ) -> None:
        self._dispatcher = dispatcher
        self.window_s = window_s
        self.max_inputs = max_inputs
        self.max_tokens = max_tokens
        self._queues: dict[tuple[str, int | None], list[_Waiting]] = {}
        self._timers: dict[tuple[str, int | None], asyncio.TimerHandle] = {}
        self._batches: set[asyncio.Task[None]] = set()

    async def embed(self, entry: ModelEntry, request: GenerateRequest) -> list[str]:
        """One vector per input of ``request.embed``, in order (``protocol.pack_vector``); raises
        ``ApiError``."""
        assert request.embed is not None
        inputs = request.embed.inputs
        if len(inputs) >= self.max_inputs or sum(map(len, inputs)) >= self.max_tokens:
            return await self._send(entry, request)
        key = (entry.name, request.embed.dimensions)
        future: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        queue = self._queues.setdefault(key, [])
        queue.append(_Waiting(inputs, future))
        full = (
            sum(len(w.inputs) for w in queue) >= self.max_inputs
            or sum(len(i) for w in queue for i in w.inputs) >= self.max_tokens
        )
        if full:
            self._flush(key, entry)
        elif key not in self._timers:
            self._timers[key] = asyncio.get_running_loop().call_later(self.window_s, self._flush, key, entry)
        return await future

    def _flush(self, key: tuple[str, int | None], entry: ModelEntry) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        waiting = [w for w in self._queues.pop(key, []) if not w.future.done()]
        if waiting:
            task = asyncio.create_task(self._batch(entry, key[1], waiting), name=f"embed-batch-{key[0]}")
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)

    async def _batch(self, entry: ModelEntry, dimensions: int | None, waiting: list[_Waiting]) -> None:
        inputs = [i for w in waiting for i in w.inputs]
        request = GenerateRequest(
            request_id=uuid.uuid4().hex,
            model=entry.name,
            token_ids=inputs[0],
            stop=StopConditions(max_tokens=1),
            embed=EmbedOptions(inputs=inputs, dimensions=dimensions),
        )
        try:
            vectors = await self._send(entry, request)
        except ApiError as e:
            for w in waiting:
                if not w.future.done():
                    w.future.set_exception(e)
            return
        pos = 0
        for w in waiting:
            if not w.future.done():
                w.future.set_result(vectors[pos : pos + len(w.inputs)])
            pos += len(w.inputs)
        if len(waiting) > 1:
            log.debug("Batched embeddings model=%s requests=%d inputs=%d", entry.name, len(waiting), pos)

    async def _send(self, entry: ModelEntry, request: GenerateRequest) -> list[str]:
        assert request.embed is not None
        expected = len(request.embed.inputs)
        vectors: list[str] = []
        async with contextlib.aclosing(self._dispatcher.generate(entry, request)) as chunks:
            async for chunk in chunks:
                vectors += chunk.embeddings or []
                if chunk.finish_reason is None:
                    continue
                if len(vectors) != expected:
                    raise UpstreamError(
                        f"The worker returned {len(vectors)} embeddings for {expected} inputs; is it an "
                        "embedding worker (--is-embedding)?",
                        code="bad_worker_answer",
                    )
                return vectors
        raise UpstreamError("The worker ended the stream without embeddings.", code="bad_worker_answer")

    async def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        await cancel_and_wait(*self._batches)
