"""Sweep an engine and build a ``Profile``: the I/O of ``python -m dynamo_worker.profile``.

Two targets, one measurement:

- ``frontend``: our (or any OpenAI-compatible) frontend, ``POST /v1/completions`` streamed, the prompt
  given as token ids so the input length is exact and no tokenizer runs in the client;
- ``worker``: an aggregated worker's request plane (``host:port``, through the frontend's own
  ``RequestClient``), which leaves the frontend out of the figures.

Prefill: for each input length, ``repeats`` lone requests (one after the other, ``max_tokens=1``) with
fresh random token ids (so no prefix-cache hit); TTFT is their median.

Decode: for each context ``c`` and batch size ``b``, ``b`` requests at once with ``c - osl/2`` prompt
tokens and ``osl`` output tokens (so the mean context while decoding is ``c``); the ITL of a request
is the mean gap between its tokens after the last request of the batch got its first token (so the
batch's prefills are not counted), and the cell is the median over the batch.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import aiohttp
import orjson
from dynamo_api.errors import DynamoError

from dynamo_worker.profile.model import DecodeTable, PrefillTable
from dynamo_worker.protocol import GenerateRequest, SamplingOptions, StopConditions
from dynamo_worker.runtime.request_plane import RequestClient, RequestPlaneError

__all__ = ["SweepError", "Sweeper"]


class SweepError(DynamoError, RuntimeError):
    """A request of the sweep failed; the message says which and why."""


@dataclass
class _Timed:
    start: float
    tokens: list[float] = field(default_factory=list)  # arrival time of each token


class Sweeper:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        model: str,
        target: Literal["frontend", "worker"] = "frontend",
        *,
        vocab: tuple[int, int] = (10, 1000),
        seed: int = 0,
        timeout_s: float = 300.0,
    ) -> None:
        self.session, self.model, self.target = session, model, target
        root = url.rstrip("/").removesuffix("/v1")
        self.endpoint = f"{root}/v1/completions" if target == "frontend" else root.partition("://")[2] or root
        self.vocab, self.rng, self.timeout_s = vocab, random.Random(seed), timeout_s
        self.client = RequestClient(first_token_timeout_s=timeout_s, inter_token_timeout_s=timeout_s)

    async def close(self) -> None:
        await self.client.close()

    def _ids(self, n: int) -> list[int]:
        return [self.rng.randrange(*self.vocab) for _ in range(max(n, 1))]

    async def one(self, isl: int, max_tokens: int) -> _Timed:
        """Send one request; the arrival time of each token (a chunk of k tokens counts k times)."""
        timed = _Timed(time.perf_counter())
        ids = self._ids(isl)
        try:
            async with asyncio.timeout(self.timeout_s):
                if self.target == "frontend":
                    await self._frontend(ids, max_tokens, timed)
                else:
                    await self._worker(ids, max_tokens, timed)
        except (aiohttp.ClientError, RequestPlaneError, TimeoutError) as e:
            raise SweepError(f"Could not complete a request to {self.endpoint}: {e!r}; is it serving?") from e
        if not timed.tokens:
            raise SweepError(f"{self.endpoint} returned no tokens for a {isl}-token prompt")
        return timed

    async def _frontend(self, ids: list[int], max_tokens: int, timed: _Timed) -> None:
        body = {
            "model": self.model,
            "prompt": ids,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "temperature": 0.0,
        }
        headers = {"Content-Type": "application/json"}
        async with self.session.post(self.endpoint, data=orjson.dumps(body), headers=headers) as r:
            if r.status != 200:
                raise SweepError(f"{self.endpoint} answered HTTP {r.status}: {(await r.text())[:300]}")
            async for raw in r.content:
                now = time.perf_counter()
                line = raw.strip()
                if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                    continue
                event = orjson.loads(line[5:])
                if "error" in event:
                    raise SweepError(f"the stream failed: {event['error']}")
                if any(c.get("text") for c in event.get("choices") or ()):
                    timed.tokens.append(now)

    async def _worker(self, ids: list[int], max_tokens: int, timed: _Timed) -> None:
        request = GenerateRequest(
            request_id=uuid.uuid4().hex,
            model=self.model,
            token_ids=ids,
            sampling=SamplingOptions(temperature=0.0),
            stop=StopConditions(max_tokens=max_tokens, ignore_eos=True),
        )
        async for chunk in self.client.generate(self.endpoint, request):
            now = time.perf_counter()
            if chunk.error is not None:
                raise SweepError(f"the worker failed the request: {chunk.error.message}")
            timed.tokens.extend([now] * len(chunk.token_ids))

    async def prefill(self, isls: Sequence[int], repeats: int = 3) -> PrefillTable:
        ttft = []
        for isl in isls:
            runs = [await self.one(isl, 1) for _ in range(repeats)]
            ttft.append(round(statistics.median((r.tokens[0] - r.start) * 1e3 for r in runs), 3))
        return PrefillTable(isl=list(isls), ttft_ms=ttft)

    async def decode(self, batches: Sequence[int], contexts: Sequence[int], osl: int = 64) -> DecodeTable:
        rows: list[list[float]] = []
        for b in batches:
            row = []
            for c in contexts:
                runs = await asyncio.gather(*(self.one(max(c - osl // 2, 1), osl) for _ in range(b)))
                settled = max(r.tokens[0] for r in runs)
                gaps = []
                for r in runs:
                    after = [t for t in r.tokens if t >= settled]
                    if len(after) >= 2:
                        gaps.append((after[-1] - after[0]) / (len(after) - 1))
                if not gaps:
                    raise SweepError(f"batch {b} at context {c}: too few tokens to time; raise --decode-osl")
                row.append(round(statistics.median(gaps) * 1e3, 3))
            rows.append(row)
        return DecodeTable(batch_size=list(batches), context=list(contexts), itl_ms=rows)
