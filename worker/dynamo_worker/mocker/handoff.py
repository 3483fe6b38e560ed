"""The mocker's KV handoff between a prefill and a decode leg (``KvHandoff``), as SGLang's bootstrap,
prealloc and transfer queues: a prefill leg waits for its decode leg's handshake and publishes its result
on this worker's bootstrap server; a decode leg reserves the prompt's KV, fetches the result and waits
the simulated transfer. The engine (``mocker.engine``) owns the KV caches and the load reports."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

import aiohttp

from dynamo_worker.mocker.bootstrap import (
    BootstrapRefused,
    BootstrapServer,
    BootstrapTimeout,
    PeerConnections,
    PrefillResult,
    fetch_prefill,
)
from dynamo_worker.mocker.kv_manager import BlockManager
from dynamo_worker.mocker.scheduler import Seq, error_chunk
from dynamo_worker.mocker.settings import MockerSettings
from dynamo_worker.mocker.timing import TimingModel
from dynamo_worker.mocker.tokens import TokenSampler
from dynamo_worker.protocol import GenerateChunk, GenerateRequest, KvEvent

__all__ = ["KvHandoff"]

log = logging.getLogger(__name__)


class KvHandoff:
    """One worker's side of the KV handoff; ``queues`` and ``bootstrap_tokens`` feed its load reports."""

    def __init__(
        self,
        settings: MockerSettings,
        *,
        kvs: Callable[[], Sequence[BlockManager]],
        timing: Callable[[], TimingModel],
        sampler: Callable[[], TokenSampler],
        publish_load: Callable[[], None],
        kv_events: Callable[[Sequence[KvEvent], int], None],
    ) -> None:
        self.settings = settings
        self.role = settings.role
        self.queues = {"bootstrap": 0, "prealloc": 0, "transfer": 0}
        self.bootstrap_tokens = 0
        self.freed = asyncio.Event()  # KV blocks were released (a decode leg may reserve now)
        self.peers = PeerConnections(settings.kv_first_transfer_s / settings.speedup)
        self.bootstrap: BootstrapServer | None = None  # a prefill worker's, once started
        self.session: aiohttp.ClientSession | None = None  # a decode worker's, once started
        self.layout = ""  # kv_layout(), once started
        self._kvs, self._timing, self._sampler = kvs, timing, sampler
        self._publish_load, self._kv_events = publish_load, kv_events

    async def before_queue(self, seq: Seq) -> GenerateChunk | None:
        """A disaggregated leg's part of the KV handoff before it is queued (``_receive`` for a decode
        leg, ``_await_handshake`` for a prefill leg); the error chunk that ends it, if it failed."""
        try:
            if self.role == "decode":
                await self._receive(seq)
            elif self.role == "prefill":
                await self._await_handshake(seq)
        except BootstrapTimeout as e:
            log.warning("Bootstrap timed out request_id=%s: %s", seq.request.request_id, e)
            return error_chunk("bootstrap_timeout", str(e))
        except BootstrapRefused as e:
            return error_chunk("bootstrap_failed", str(e))
        return None

    async def _await_handshake(self, seq: Seq) -> None:
        """Prefill leg: wait in the bootstrap queue for the decode leg's handshake (SGLang prefills a
        request only once its decode worker has reserved the memory for its KV)."""
        info = seq.request.bootstrap_info
        assert info is not None and self.bootstrap is not None
        self.queues["bootstrap"] += 1
        self.bootstrap_tokens += len(seq.tokens)
        self._publish_load()
        try:
            await self.bootstrap.decode_arrived(info.bootstrap_room, self.settings.bootstrap_timeout_s)
        finally:
            self.queues["bootstrap"] -= 1
            self.bootstrap_tokens -= len(seq.tokens)

    async def _receive(self, seq: Seq) -> None:
        """Decode leg: reserve KV memory for the prompt (prealloc queue), shake hands with the prefill
        leg and wait for its result, then receive the KV (transfer queue; the first transfer from a
        prefill engine also opens the connection, ``--kv-first-transfer-s``)."""
        request = seq.request
        assert request.bootstrap_info is not None and self.session is not None
        deadline = time.monotonic() + self.settings.bootstrap_timeout_s
        self.queues["prealloc"] += 1
        self._publish_load()
        try:
            await self._reserve(seq, deadline)
        finally:
            self.queues["prealloc"] -= 1
        self.queues["transfer"] += 1
        self._publish_load()
        try:
            result = await fetch_prefill(
                self.session,
                request.bootstrap_info,
                max(deadline - time.monotonic(), 0.5),
                self.layout,
            )
            await self.peers.ready(result.engine)
            await asyncio.sleep(self._timing().kv_transfer_s(len(seq.tokens)))
            await self._stuck_transfer(request)
        finally:
            self.queues["transfer"] -= 1
        seq.kv_ready, seq.preset_first, seq.cached_tokens = True, result.first_token, result.cached_tokens
        seq.host_cached_tokens = result.host_cached_tokens

    async def _reserve(self, seq: Seq, deadline: float) -> None:
        """Allocate the prompt's KV blocks, waiting (until ``deadline``) while the cache is full."""
        kv = self._kvs()[seq.rank]
        while True:
            alloc = kv.allocate(seq.key, seq.tokens, seq.lora)
            if alloc is not None:
                self._kv_events(alloc.events, seq.rank)
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise BootstrapTimeout(
                    f"the decode worker's KV cache had no room for {len(seq.tokens)} tokens within "
                    f"{self.settings.bootstrap_timeout_s:.0f}s (--num-kv-blocks)"
                )
            self.freed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self.freed.wait()

    async def _stuck_transfer(self, request: GenerateRequest) -> None:
        """While ``--kv-transfer-fault-file`` exists, a decode leg's KV transfer never completes: the leg
        waits until it is cancelled, as an engine whose transfer is lost while both workers stay alive."""
        fault = self.settings.kv_transfer_fault_file
        if fault is not None and fault.exists():
            log.warning("Simulated fault: the KV transfer of request_id=%s never ends", request.request_id)
            await asyncio.Event().wait()

    async def hand_over(self, seq: Seq, chunk: GenerateChunk, started: float) -> GenerateChunk:
        """Prefill leg: publish the result for the decode leg and wait until it is fetched."""
        info = seq.request.bootstrap_info
        assert info is not None and self.bootstrap is not None
        first = chunk.token_ids[0] if chunk.token_ids else self._sampler().token(seq.digest, 0)
        result = PrefillResult(
            first, len(seq.request.token_ids), seq.cached_tokens or 0, seq.host_cached_tokens
        )
        left = max(self.settings.bootstrap_timeout_s - (time.monotonic() - started), 0.5)
        self.queues["transfer"] += 1
        self._publish_load()
        try:
            await self.bootstrap.prefill_done(info.bootstrap_room, result, left)
        except BootstrapTimeout as e:
            log.warning("Bootstrap timed out request_id=%s: %s", seq.request.request_id, e)
            return error_chunk("bootstrap_timeout", str(e))
        except BootstrapRefused as e:
            return error_chunk("bootstrap_failed", str(e))
        except RuntimeError as e:
            return error_chunk("invalid_request", str(e))
        finally:
            self.queues["transfer"] -= 1
            self._publish_load()
        return chunk
