"""The mocker engine: a simulated SGLang engine behind the same ``Engine`` interface as the real one.

One scheduler task runs continuous batching. Each step it admits waiting requests in arrival order
while there is a free running slot (``--max-running-requests``), room in the KV cache, and token budget
(``--max-prefill-tokens`` of uncached prompt tokens; the first admission of a step is always allowed);
then it sleeps for the step's simulated duration (``timing.TimingModel``: the admitted prefills plus
one decode step of the running batch) and gives every running request one token. A request whose next
token needs a KV block when none is free is preempted: its blocks are released and it goes back to the
front of the queue, to be recomputed (mostly from the prefix cache).

Roles:
- ``agg``: prefill and decode here.
- ``prefill``: computes the prompt, returns one token (like SGLang's prefill with max_new_tokens=1)
  once the decode leg of the same ``bootstrap_room`` has fetched the result from this worker's
  bootstrap server; fails with ``bootstrap_timeout`` when no decode leg comes.
- ``decode``: fetches the prefill result from ``bootstrap_info`` (failing with ``bootstrap_timeout``
  when it never comes), waits the simulated KV transfer, then decodes, starting with the prefill's
  token.

Tokens: see ``tokens.TokenSampler``; they depend on the prompt, ``sampling.seed`` (else
``--random-seed``) and the position only (temperature, top-p etc. change nothing). A
``stop_token_ids`` hit (after ``min_tokens``) ends with "stop" and is not returned; eos is emitted only
with ``--eos-probability`` > 0 and is not returned either (the request's ``eos_token_ids``; never with
``ignore_eos``). Usage counts prompt tokens, completion tokens and cached tokens (prefix-cache hits;
for a decode leg, its prefill's hits).
Closing the request's iterator (the client went away) frees its blocks at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from dynamo_worker.mocker.bootstrap import BootstrapServer, BootstrapTimeout, PrefillResult, fetch_prefill
from dynamo_worker.mocker.kv_manager import BlockManager
from dynamo_worker.mocker.settings import MockerSettings
from dynamo_worker.mocker.tokens import TokenSampler, prompt_digest
from dynamo_worker.protocol import (
    ErrorType,
    FinishReason,
    GenerateChunk,
    GenerateRequest,
    KvEvent,
    Usage,
    WorkerError,
    image_pad_id,
)
from dynamo_worker.runtime.engine import Engine, EngineEventSink, EngineInfo, LoadSnapshot, NullEventSink
from dynamo_worker.tinymodel import MODEL_NAME as TINY_MODEL_NAME
from dynamo_worker.tinymodel import ensure_tiny_model

__all__ = ["MockerEngine", "resolve_model_dir"]

log = logging.getLogger(__name__)

DEFAULT_CONTEXT_LENGTH = 4096
DEFAULT_KV_BYTES_PER_TOKEN = 131_072
TINY_MODEL_DIR = "dynamo-tiny-model"


def _read_config(model_dir: Path) -> dict:
    try:
        data = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _kv_bytes_from_config(config: dict) -> int | None:
    """2 (K and V) x layers x kv heads x head dim x 2 bytes (bf16), when config.json tells."""
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
        head_dim = int(
            config.get("head_dim") or int(config["hidden_size"]) // int(config["num_attention_heads"])
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return 2 * layers * heads * head_dim * 2


def resolve_model_dir(settings: MockerSettings) -> Path:
    """The folder with the tokenizer: --model-dir, else --model-path / --tokenizer-path when they are
    folders, else the tiny model (created in the temp dir)."""
    for candidate in (settings.model_dir, settings.model_path, settings.tokenizer_path):
        if candidate is not None and Path(candidate).is_dir():
            return Path(candidate)
    if settings.model_dir is not None:
        raise FileNotFoundError(
            f"--model-dir {settings.model_dir} is not a folder; create it or drop the flag"
        )
    path = ensure_tiny_model(Path(tempfile.gettempdir()) / TINY_MODEL_DIR)
    log.info("Using the tiny model folder path=%s (no model folder given)", path)
    return path


@dataclass(eq=False)
class _Seq:
    key: str
    request: GenerateRequest
    tokens: list[int]  # tokens that need KV: the prompt (+ generated ones after a preemption)
    max_new: int
    digest: int
    out: asyncio.Queue[GenerateChunk] = field(default_factory=asyncio.Queue)  # <= max_new + 1 items
    kv_ready: bool = False  # the KV arrives by transfer (decode leg): no prefill compute
    preset_first: int | None = None  # the prefill leg's token, emitted first by a decode leg
    cached_tokens: int | None = None
    generated: list[int] = field(default_factory=list)
    finished: bool = False


def _error(error_type: ErrorType, message: str) -> GenerateChunk:
    return GenerateChunk(finish_reason="error", error=WorkerError(type=error_type, message=message))


class MockerEngine(Engine):
    def __init__(
        self, settings: MockerSettings, *, listen_host: str = "127.0.0.1", advertise_host: str = "127.0.0.1"
    ) -> None:
        self.settings = settings
        self.role = settings.role
        self._listen_host = listen_host
        self._advertise_host = advertise_host
        self._sink: EngineEventSink = NullEventSink()
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._wakeup = asyncio.Event()
        self._keys = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._last_load: LoadSnapshot | None = None
        self.bootstrap: BootstrapServer | None = None
        self.kv = BlockManager(settings.num_kv_blocks, settings.page_size)
        self.timing = settings.timing(settings.kv_bytes_per_token or DEFAULT_KV_BYTES_PER_TOKEN)
        self.sampler = TokenSampler.from_vocab_size(settings.vocab_size)
        self.context_length = settings.context_length or DEFAULT_CONTEXT_LENGTH
        self.stopping = False

    # --- Engine interface ------------------------------------------------------------------------

    def attach_events(self, sink: EngineEventSink) -> None:
        self._sink = sink

    async def start(self) -> EngineInfo:
        s = self.settings
        model_dir = await asyncio.to_thread(resolve_model_dir, s)
        config = _read_config(model_dir)
        ctx = config.get("max_position_embeddings")
        self.context_length = s.context_length or (
            ctx if isinstance(ctx, int) and ctx > 1 else DEFAULT_CONTEXT_LENGTH
        )
        kv_bytes = s.kv_bytes_per_token or _kv_bytes_from_config(config) or DEFAULT_KV_BYTES_PER_TOKEN
        self.timing = s.timing(kv_bytes)
        self.sampler = await asyncio.to_thread(TokenSampler.from_model_dir, model_dir, s.vocab_size)
        bootstrap_port = None
        if self.role == "prefill":
            self.bootstrap = BootstrapServer(self._listen_host, s.disaggregation_bootstrap_port)
            bootstrap_port = await self.bootstrap.start()
        if self.role == "decode":
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0))
        self._task = asyncio.create_task(self._loop(), name="mocker-scheduler")
        self._publish_load()
        name = s.served_model_name or s.model_path or model_dir.name
        if name == TINY_MODEL_DIR:
            name = TINY_MODEL_NAME
        log.info(
            "Started mocker role=%s model=%s kv_blocks=%s page_size=%s speedup=%s",
            self.role,
            name,
            s.num_kv_blocks,
            s.page_size,
            s.speedup,
        )
        return EngineInfo(
            model_name=name,
            page_size=s.page_size,
            total_kv_blocks=s.num_kv_blocks,
            max_running_requests=s.max_running_requests,
            bootstrap_host=self._advertise_host if bootstrap_port else None,
            bootstrap_port=bootstrap_port,
            dp_size=s.dp_size,
            model_dir=model_dir,
            context_length=self.context_length,
        )

    async def health_check(self) -> None:
        if self._task is None:
            raise RuntimeError("mocker not started")
        if self._task.done():
            why = "cancelled" if self._task.cancelled() else repr(self._task.exception())
            raise RuntimeError(f"mocker scheduler stopped: {why}")

    async def stop(self) -> None:
        self.stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for seq in [*self._waiting, *self._running]:
            self._fail(seq, "shutting_down", "worker shut down before the request finished")
        if self.bootstrap is not None:
            await self.bootstrap.stop()
        if self._session is not None:
            await self._session.close()

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        started = time.monotonic()
        queued = False
        problem = self._check(request)
        if problem is not None:
            yield problem
            return
        prompt = list(request.token_ids)
        seed = request.sampling.seed if request.sampling.seed is not None else self.settings.random_seed
        seq = _Seq(
            key=f"{request.request_id}#{next(self._keys)}",
            request=request,
            tokens=prompt,
            max_new=1
            if self.role == "prefill"
            else min(request.stop.max_tokens, self.context_length - len(prompt)),
            digest=prompt_digest(prompt, seed),
        )
        try:
            if self.role == "decode":
                assert request.bootstrap_info is not None and self._session is not None
                try:
                    result = await fetch_prefill(
                        self._session, request.bootstrap_info, self.settings.bootstrap_timeout_s
                    )
                except BootstrapTimeout as e:
                    log.warning("Bootstrap timed out request_id=%s: %s", request.request_id, e)
                    yield _error("bootstrap_timeout", str(e))
                    return
                await asyncio.sleep(self.timing.kv_transfer_s(len(prompt)))
                seq.kv_ready, seq.preset_first, seq.cached_tokens = (
                    True,
                    result.first_token,
                    result.cached_tokens,
                )
            self._waiting.append(seq)
            queued = True
            self._wakeup.set()
            while True:
                chunk = await seq.out.get()
                if (
                    chunk.finish_reason is not None
                    and chunk.finish_reason != "error"
                    and self.role == "prefill"
                ):
                    chunk = await self._hand_over(seq, chunk, started)
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            if queued and not seq.finished:
                self._drop(seq)
                log.info("Aborted request request_id=%s", request.request_id)

    # --- requests --------------------------------------------------------------------------------

    def _check(self, request: GenerateRequest) -> GenerateChunk | None:
        n = len(request.token_ids)
        if self.stopping:
            return _error("shutting_down", "worker is shutting down")
        if n >= self.context_length:
            return _error(
                "invalid_request",
                f"prompt has {n} tokens; the context length is {self.context_length}: shorten the prompt",
            )
        if self.kv.blocks_needed(n + 1) > self.kv.total_blocks:
            return _error(
                "invalid_request",
                f"prompt needs {self.kv.blocks_needed(n + 1)} KV blocks but the cache has "
                f"{self.kv.total_blocks}; raise --num-kv-blocks",
            )
        if request.data_parallel_rank is not None and request.data_parallel_rank >= self.settings.dp_size:
            return _error(
                "invalid_request", f"data_parallel_rank must be below dp_size={self.settings.dp_size}"
            )
        for i, span in enumerate(request.images):  # the pad ids stand for the image, as in SGLang
            pad = image_pad_id(span.embedding.content_hash)
            end = span.offset + span.embedding.num_tokens
            if any(t != pad for t in request.token_ids[span.offset : end]):
                return _error("invalid_request", f"images[{i}]: its token_ids are not its pad id {pad}")
        if self.role != "agg" and request.bootstrap_info is None:
            return _error("invalid_request", f"a {self.role} worker needs bootstrap_info in the request")
        if self.role == "prefill" and self.bootstrap is not None:
            port = request.bootstrap_info.bootstrap_port  # type: ignore[union-attr]
            if port != self.bootstrap.port:
                return _error(
                    "invalid_request",
                    f"bootstrap_port {port} is not this prefill worker's bootstrap port "
                    f"{self.bootstrap.port}",
                )
        return None

    async def _hand_over(self, seq: _Seq, chunk: GenerateChunk, started: float) -> GenerateChunk:
        """Prefill leg: publish the result for the decode leg and wait until it is fetched."""
        info = seq.request.bootstrap_info
        assert info is not None and self.bootstrap is not None
        first = chunk.token_ids[0] if chunk.token_ids else self.sampler.token(seq.digest, 0)
        result = PrefillResult(first, len(seq.request.token_ids), seq.cached_tokens or 0)
        left = max(self.settings.bootstrap_timeout_s - (time.monotonic() - started), 0.5)
        try:
            await self.bootstrap.prefill_done(info.bootstrap_room, result, left)
        except BootstrapTimeout as e:
            log.warning("Bootstrap timed out request_id=%s: %s", seq.request.request_id, e)
            return _error("bootstrap_timeout", str(e))
        except RuntimeError as e:
            return _error("invalid_request", str(e))
        return chunk

    # --- scheduler -------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            if not self._waiting and not self._running:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            prefill_s, computed = self._admit()
            decoding = len(self._running) - computed
            kv_tokens = sum(self.kv.seq_tokens(s.key) for s in self._running)
            self._publish_load()
            await asyncio.sleep(prefill_s + self.timing.decode_step_s(decoding, kv_tokens))
            for seq in list(self._running):
                if not seq.finished:
                    self._advance(seq)
            self._publish_load()

    def _admit(self) -> tuple[float, int]:
        """Move waiting requests into the batch. Returns the prefill time and how many were prefilled."""
        budget = self.settings.max_prefill_tokens
        prefill_s, computed = 0.0, 0
        admitted = 0
        while self._waiting and len(self._running) < self.settings.max_running_requests:
            seq = self._waiting[0]
            if seq.finished:
                self._waiting.popleft()
                continue
            new_tokens = 0 if seq.kv_ready else len(seq.tokens) - self.kv.cached_prefix_tokens(seq.tokens)
            if admitted and new_tokens > budget:
                break
            alloc = self.kv.allocate(seq.key, seq.tokens)
            if alloc is None:
                if not self._running:
                    self._waiting.popleft()
                    self._fail(
                        seq, "invalid_request", "the KV cache cannot hold this request; raise --num-kv-blocks"
                    )
                    continue
                break
            self._waiting.popleft()
            admitted += 1
            self._kv_events(alloc.events)
            if seq.cached_tokens is None:
                seq.cached_tokens = alloc.cached_tokens
            self._running.append(seq)
            if seq.kv_ready:
                if seq.preset_first is not None and not seq.generated:
                    self._advance(seq)  # the transferred first token goes out at once
            else:
                uncached = len(seq.tokens) - alloc.cached_tokens
                prefill_s += self.timing.prefill_s(uncached, alloc.cached_tokens)
                budget -= uncached
                computed += 1
        return prefill_s, computed

    def _advance(self, seq: _Seq) -> None:
        """Give ``seq`` its next token (or finish it)."""
        req, pos = seq.request, len(seq.generated)
        if pos == 0 and seq.preset_first is not None:
            token = seq.preset_first
        else:
            token = self.sampler.token(seq.digest, pos)
            p = self.settings.eos_probability
            if (
                p > 0
                and req.eos_token_ids
                and not req.stop.ignore_eos
                and pos >= req.stop.min_tokens
                and self.sampler.chance(seq.digest, pos) < p
            ):
                token = req.eos_token_ids[0]
        eos = not req.stop.ignore_eos and token in req.eos_token_ids
        if pos >= req.stop.min_tokens and (token in req.stop.stop_token_ids or eos):
            self._finish(seq, [], "stop")
            return
        seq.generated.append(token)
        if len(seq.generated) >= seq.max_new:
            self._finish(seq, [token], "length")
            return
        events = self.kv.append(seq.key, token)
        if events is None:
            self._preempt(seq)
        else:
            self._kv_events(events)
        seq.out.put_nowait(GenerateChunk(token_ids=[token]))

    def _finish(self, seq: _Seq, tokens: list[int], reason: FinishReason) -> None:
        seq.finished = True
        self._release(seq)
        usage = Usage(
            prompt_tokens=len(seq.request.token_ids),
            completion_tokens=len(seq.generated),
            cached_tokens=seq.cached_tokens or 0,
        )
        seq.out.put_nowait(GenerateChunk(token_ids=tokens, finish_reason=reason, usage=usage))

    def _fail(self, seq: _Seq, error_type: ErrorType, message: str) -> None:
        seq.finished = True
        self._release(seq)
        seq.out.put_nowait(_error(error_type, message))

    def _preempt(self, seq: _Seq) -> None:
        log.info("Preempted request request_id=%s (KV cache full)", seq.request.request_id)
        self._release(seq)
        seq.tokens = [*seq.request.token_ids, *seq.generated]
        seq.kv_ready = False
        self._waiting.appendleft(seq)

    def _release(self, seq: _Seq) -> None:
        self.kv.free(seq.key)
        if seq in self._running:
            self._running.remove(seq)

    def _drop(self, seq: _Seq) -> None:
        """The client went away: forget the request and free its blocks now."""
        seq.finished = True
        self._release(seq)
        with contextlib.suppress(ValueError):
            self._waiting.remove(seq)
        self._publish_load()

    # --- events ----------------------------------------------------------------------------------

    def _kv_events(self, events: Sequence[KvEvent]) -> None:
        if events:
            self._sink.kv_events(events)

    def _publish_load(self) -> None:
        snap = LoadSnapshot(
            active_blocks=self.kv.active_blocks,
            total_blocks=self.kv.total_blocks,
            waiting=len(self._waiting),
            running=len(self._running),
        )
        if snap != self._last_load:
            self._last_load = snap
            self._sink.load(snap)
