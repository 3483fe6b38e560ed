"""What the scheduler produced for one request that its reader has not taken yet (``Outbox``)."""

from __future__ import annotations

import asyncio

from dynamo_worker.protocol import GenerateChunk, TokenLogprob

__all__ = ["Outbox"]


class Outbox:
    """What the scheduler produced for one request that its reader has not taken yet: the token ids
    (with their logprobs, when asked) and at most one final chunk. The reader takes all ready tokens
    as one chunk, so a stream whose reader fell behind catches up with one write instead of one per
    token (nothing waits to be merged); tokens are kept as ids, not as a chunk per token."""

    __slots__ = ("final", "ids", "logprobs", "waiter")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.logprobs: list[TokenLogprob] | None = None  # aligned with ids, when the request asked
        self.final: GenerateChunk | None = None  # the last chunk; after the ids
        self.waiter: asyncio.Future[None] | None = None  # the reader, waiting for something to take

    def put(self, token: int, logprobs: list[TokenLogprob] | None, hand_over: bool = True) -> None:
        """Add a token; ``hand_over``: wake the reader (False: keep it for a later hand-over)."""
        self.ids.append(token)
        if logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs += logprobs
        if hand_over:
            self._wake()

    def put_final(self, chunk: GenerateChunk) -> None:
        self.final = chunk
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def take(self) -> GenerateChunk:
        """The ready tokens as one chunk, else the final chunk; waits for either."""
        while not self.ids and self.final is None:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        if self.ids:
            chunk = GenerateChunk(token_ids=self.ids, logprobs=self.logprobs)
            self.ids, self.logprobs = [], None
            return chunk
        assert self.final is not None
        return self.final
