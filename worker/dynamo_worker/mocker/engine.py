"""The mocker engine: a simulated SGLang engine behind the same ``Engine`` interface as the real one.

One scheduler task runs continuous batching: each step it admits waiting requests (``scheduler.admit``),
sleeps the step's simulated duration (``timing.TimingModel``) and gives the batch's requests a token
each (``scheduler.next_token``); a request that needs a KV block when none is free is preempted and
recomputed. Roles ``agg``, ``prefill`` and ``decode`` (the KV handoff: ``handoff``), data parallelism
(``--dp-size``: a KV cache per rank), LoRA adapters (``lora``), the HiCache host tier (``kv_manager``),
scripted replies and embeddings (``scripted``), and engine death (``scheduler_process``). It reports
SGLang's load (``sglang.load.snapshot``). Tokens depend on the seed and the sequence before them only,
so a migrated stream goes on token for token. What each simulates, and how: docs/mocker.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import aiohttp

from dynamo_worker.mocker.bootstrap import (
    BootstrapServer,
    kv_layout,
)
from dynamo_worker.mocker.checks import check_kind, check_lora, check_request, start_loras
from dynamo_worker.mocker.handoff import KvHandoff
from dynamo_worker.mocker.kv_manager import BlockManager
from dynamo_worker.mocker.lora import MockLoras
from dynamo_worker.mocker.model_dir import (
    TINY_MODEL_DIR,
    _kv_bytes_from_config,
    _read_config,
    resolve_model_dir,
    serving_features,
    size_host_tier,
)
from dynamo_worker.mocker.scheduler import Refuse, Seq, admit, batch_step, hands_over, next_token
from dynamo_worker.mocker.scheduler import error_chunk as _error
from dynamo_worker.mocker.scheduler_process import SchedulerProcess
from dynamo_worker.mocker.scripted import ScriptRule, embedding, json_for_schema, load_script, token_logprobs
from dynamo_worker.mocker.settings import MockerSettings
from dynamo_worker.mocker.tokens import TokenSampler, next_state, prompt_digest
from dynamo_worker.protocol import (
    ErrorType,
    FinishReason,
    GenerateChunk,
    GenerateRequest,
    KvEvent,
    TokenLogprob,
    Usage,
    embedding_chunks,
    lora_seed,
)
from dynamo_worker.runtime.aio import cancel_and_wait
from dynamo_worker.runtime.engine import (
    Engine,
    EngineEventSink,
    EngineInfo,
    EngineProcess,
    LoadSnapshot,
    NullEventSink,
)
from dynamo_worker.runtime.lora_checks import (
    LoraLimits,
    StartupAdapter,
)
from dynamo_worker.tinymodel import MODEL_NAME as TINY_MODEL_NAME

__all__ = ["MockerEngine"]

log = logging.getLogger(__name__)

DEFAULT_CONTEXT_LENGTH = 4096
DEFAULT_KV_BYTES_PER_TOKEN = 131_072


def script_continuation(reply: list[int], prompt: Sequence[int]) -> list[int]:
    """What is left of a scripted ``reply`` after its longest prefix that ends ``prompt``: a migrated
    request (whose prompt carries the tokens already streamed) goes on with the reply where it broke off,
    as a greedy model would, instead of starting it again."""
    for k in range(min(len(reply), len(prompt)), 0, -1):
        if reply[:k] == list(prompt[-k:]):
            return reply[k:]
    return reply


class MockerEngine(Engine):
    def __init__(
        self,
        settings: MockerSettings,
        *,
        listen_host: str = "127.0.0.1",
        advertise_host: str = "127.0.0.1",
        scheduler_process: bool = False,
    ) -> None:
        self.settings = settings
        self.role = settings.role
        self._listen_host = listen_host
        self._advertise_host = advertise_host
        self._sink: EngineEventSink = NullEventSink()
        self._waiting: deque[Seq] = deque()
        self._running: list[Seq] = []
        self._wakeup = asyncio.Event()
        self._keys = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._last_load: LoadSnapshot | None = None
        self.handoff = KvHandoff(
            settings,
            kvs=lambda: self.kvs,
            timing=lambda: self.timing,
            sampler=lambda: self.sampler,
            publish_load=self._publish_load,
            kv_events=self._kv_events,
        )
        self.kvs = self._new_caches()
        self.kv = self.kvs[0]  # rank 0 (the only one unless --dp-size > 1)
        self._next_rank = itertools.count()
        self.timing = settings.timing(settings.kv_bytes_per_token or DEFAULT_KV_BYTES_PER_TOKEN)
        self.sampler = TokenSampler.from_vocab_size(settings.vocab_size)
        self.context_length = settings.context_length or DEFAULT_CONTEXT_LENGTH
        self.stopping = False
        self.rules: list[ScriptRule] = load_script(settings.script) if settings.script else []
        self.embedding_dim = settings.embedding_dim or 64
        self._tokenizer: Any = None  # decodes prompts for --script, encodes replies
        label = f"mocker-scheduler node_rank={settings.node_rank}"
        self.scheduler = SchedulerProcess(label) if scheduler_process else None
        self._bootstrap_port = settings.disaggregation_bootstrap_port  # the bound one, after a start
        self.loras = self._new_loras()
        self._lora_limits: LoraLimits | None = None
        self._startup_loras: list[StartupAdapter] = []
        self._lora_drained: asyncio.Event | None = None  # set when a request of an adapter ends

    # --- Engine interface ------------------------------------------------------------------------

    def attach_events(self, sink: EngineEventSink) -> None:
        self._sink = sink

    def processes(self) -> list[EngineProcess]:
        s = self.scheduler
        return [EngineProcess("scheduler", s.pid)] if s is not None and s.alive() else []

    def _new_caches(self) -> list[BlockManager]:
        s = self.settings
        host = s.host_blocks(s.kv_bytes_per_token or DEFAULT_KV_BYTES_PER_TOKEN)
        return [BlockManager(s.gpu_blocks, s.page_size, host) for _ in range(s.dp_size)]

    def _new_loras(self) -> MockLoras | None:
        s = self.settings
        if not s.lora_enabled:
            return None
        return MockLoras(s.max_loras_per_batch, s.max_loaded_loras, s.lora_eviction_policy)

    def _reset(self) -> None:
        """An empty engine: what ``start`` begins with, the first time and after a ``stop`` (no KV cache,
        no queue, only the adapters it starts with)."""
        self.stopping = False
        self._waiting.clear()
        self._running.clear()
        self._wakeup = asyncio.Event()
        self._last_load = None
        self.kvs = self._new_caches()
        self.kv = self.kvs[0]
        self.loras = self._new_loras()

    async def start(self) -> EngineInfo:
        s = self.settings
        self._reset()
        if self.scheduler is not None:
            self.scheduler.start()
        model_dir = await asyncio.to_thread(resolve_model_dir, s)
        config = _read_config(model_dir)
        ctx = config.get("max_position_embeddings")
        self.context_length = s.context_length or (
            ctx if isinstance(ctx, int) and ctx > 1 else DEFAULT_CONTEXT_LENGTH
        )
        kv_bytes = s.kv_bytes_per_token or _kv_bytes_from_config(config) or DEFAULT_KV_BYTES_PER_TOKEN
        self.timing = s.timing(kv_bytes)
        size_host_tier(self.kvs, s, kv_bytes, self.timing)
        self.sampler = await asyncio.to_thread(TokenSampler.from_model_dir, model_dir, s.vocab_size)
        if (model_dir / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            self._tokenizer = await asyncio.to_thread(Tokenizer.from_file, str(model_dir / "tokenizer.json"))
        hidden = config.get("hidden_size")
        self.embedding_dim = s.embedding_dim or (hidden if isinstance(hidden, int) and hidden > 0 else 64)
        name = s.served_model_name or s.model_path or model_dir.name
        if name == TINY_MODEL_DIR:
            name = TINY_MODEL_NAME
        self.handoff.layout = kv_layout(name, s.page_size)
        if self.loras is not None:
            self._lora_limits, self._startup_loras = await start_loras(s, self.loras)
        bootstrap_port = None
        if self.role == "prefill":
            self.handoff.bootstrap = BootstrapServer(
                self._listen_host, self._bootstrap_port, layout=self.handoff.layout
            )
            bootstrap_port = self._bootstrap_port = await self.handoff.bootstrap.start()
        if self.role == "decode":
            self.handoff.session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0)
            )
        self._task = asyncio.create_task(self._loop(), name="mocker-scheduler")
        self._publish_load()
        log.info(
            "Started mocker role=%s model=%s kv_blocks=%s host_kv_blocks=%s page_size=%s speedup=%s "
            "scheduler_pid=%s",
            self.role,
            name,
            s.gpu_blocks,
            self.kv.host_blocks,
            s.page_size,
            s.speedup,
            self.scheduler.pid if self.scheduler is not None else None,
        )
        return EngineInfo(
            model_name=name,
            page_size=s.page_size,
            total_kv_blocks=s.gpu_blocks * s.dp_size,
            max_running_requests=s.max_running_requests,
            bootstrap_host=self._advertise_host if bootstrap_port else None,
            bootstrap_port=bootstrap_port,
            dp_size=s.dp_size,
            model_dir=model_dir,
            context_length=self.context_length,
            features=serving_features(s, config, self.embedding_dim),
            nnodes=s.nnodes,
        )

    # --- LoRA ----------------------------------------------------------------------------------------

    def lora_limits(self) -> LoraLimits | None:
        return self._lora_limits if self.loras is not None else None

    def startup_loras(self) -> list[StartupAdapter]:
        return list(self._startup_loras)

    async def load_lora(self, name: str, path: str, pinned: bool) -> list[str]:
        if self.loras is None:
            return await super().load_lora(name, path, pinned)
        await asyncio.sleep(self.settings.lora_load_ms / 1e3 / self.settings.speedup)
        return self.loras.load(name, pinned)

    async def unload_lora(self, name: str) -> list[str]:
        """Refuse new requests for ``name``, let its queued and running ones finish, then drop it."""
        if self.loras is None:
            return await super().unload_lora(name)
        self.loras.unloading.add(name)
        while any(s.lora == name and not s.finished for s in (*self._waiting, *self._running)):
            self._lora_drained = self._lora_drained or asyncio.Event()
            self._lora_drained.clear()
            await self._lora_drained.wait()
        return self.loras.unload(name)

    async def health_check(self) -> None:
        if self._task is None:
            raise RuntimeError("mocker not started")
        if self._task.done():
            why = "cancelled" if self._task.cancelled() else repr(self._task.exception())
            raise RuntimeError(f"mocker scheduler stopped: {why}")
        fault = self.settings.health_fault_file
        if fault is not None and fault.exists():
            raise RuntimeError(f"simulated engine fault ({fault} exists)")

    async def stop(self) -> None:
        self.stopping = True
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        for seq in [*self._waiting, *self._running]:
            self._fail(seq, "shutting_down", "worker shut down before the request finished")
        if self.handoff.bootstrap is not None:
            await self.handoff.bootstrap.stop()
            self.handoff.bootstrap = None
        if self.handoff.session is not None:
            await self.handoff.session.close()
            self.handoff.session = None
        if self.scheduler is not None:
            await self.scheduler.stop()

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        started = time.monotonic()
        queued = False
        bootstrap = self.handoff.bootstrap
        problem = (
            check_request(
                request,
                self.settings,
                stopping=self.stopping,
                context_length=self.context_length,
                kv=self.kv,
                bootstrap_port=bootstrap.port if bootstrap is not None else None,
            )
            or check_kind(
                request, self.settings, embedding_dim=self.embedding_dim, context_length=self.context_length
            )
            or check_lora(request, self.loras)
        )
        if problem is not None:
            yield problem
            return
        if request.embed is not None:
            for chunk in await self._embed(request):
                yield chunk
            return
        seq = self._new_seq(request)
        scripted = self._scripted(request, seq.digest)
        if isinstance(scripted, GenerateChunk):
            yield scripted
            return
        seq.script = scripted
        try:
            refused = await self.handoff.before_queue(seq)
            if refused is not None:
                yield refused
                return
            seq.queued_tokens = 0 if seq.kv_ready else self._uncached(seq)
            self._waiting.append(seq)
            queued = True
            self._wakeup.set()
            self._publish_load()
            while True:
                chunk = await seq.out.take()
                if (
                    chunk.finish_reason is not None
                    and chunk.finish_reason != "error"
                    and self.role == "prefill"
                ):
                    chunk = await self.handoff.hand_over(seq, chunk, started)
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            if not seq.finished and (queued or self.kvs[seq.rank].has_seq(seq.key)):
                self._drop(seq)
                log.info("Aborted request request_id=%s", request.request_id)

    # --- the KV handoff (SGLang's bootstrap, prealloc and transfer queues) -------------------------

    def _uncached(self, seq: Seq) -> int:
        return len(seq.tokens) - self.kvs[seq.rank].cached_prefix_tokens(seq.tokens, seq.lora)

    # --- requests --------------------------------------------------------------------------------

    def _new_seq(self, request: GenerateRequest) -> Seq:
        """The scheduler's record of ``request``: its tokens depend on the prompt, the seed and the
        adapter, and it goes to its data-parallel rank (or the ranks in turn)."""
        prompt = list(request.token_ids)
        seed = request.sampling.seed if request.sampling.seed is not None else self.settings.random_seed
        if request.lora_name is not None:  # in the seed: a continuation of the adapter's answer stays exact
            seed ^= lora_seed(request.lora_name)
        digest = prompt_digest(prompt, seed)
        rank = request.data_parallel_rank
        return Seq(
            key=f"{request.request_id}#{next(self._keys)}",
            request=request,
            tokens=prompt,
            max_new=1
            if self.role == "prefill"
            else min(request.stop.max_tokens, self.context_length - len(prompt)),
            digest=digest,
            rank=rank if rank is not None else next(self._next_rank) % len(self.kvs),
        )

    async def _embed(self, request: GenerateRequest) -> list[GenerateChunk]:
        assert request.embed is not None
        inputs = request.embed.inputs
        total = sum(len(i) for i in inputs)
        await asyncio.sleep(self.timing.prefill_s(total, 0))
        dims = request.embed.dimensions
        vectors = [embedding(ids, self.embedding_dim, dims, self.settings.random_seed) for ids in inputs]
        return embedding_chunks(vectors, Usage(prompt_tokens=total, completion_tokens=0))

    def _scripted(self, request: GenerateRequest, digest: int) -> list[int] | GenerateChunk | None:
        """The output the script or the request's grammar fixes, an error chunk, or None (sampled)."""
        structured = request.structured
        if structured is not None:
            if self.settings.grammar_backend == "none" or self.settings.skip_tokenizer_init:
                return _error(
                    "invalid_request",
                    "this worker has no grammar backend (--grammar-backend none or --skip-tokenizer-init)",
                )
            if structured.json_schema is None:
                kind = next(k for k, v in structured.model_dump().items() if v is not None)
                return _error(
                    "invalid_request",
                    f"the mocker simulates json_schema constraints only; got a {kind} constraint "
                    f"({getattr(structured, kind)!r}), which needs SGLang",
                )
            try:
                schema = json.loads(structured.json_schema)
            except ValueError as e:
                return _error("invalid_request", f"json_schema is not valid JSON: {e}")
            return self._encode(json.dumps(json_for_schema(schema, digest & 0xFFFF)))
        if not self.rules or self._tokenizer is None:
            return None
        prompt = self._tokenizer.decode(list(request.token_ids), skip_special_tokens=False)
        for rule in self.rules:
            if rule.match in prompt:
                return script_continuation(self._encode(rule.reply), request.token_ids)
        return None

    def _encode(self, text: str) -> list[int]:
        if self._tokenizer is None:
            return [self.sampler.token(len(text), i) for i in range(len(text.split()))]
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    # --- scheduler -------------------------------------------------------------------------------

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        ended: float | None = None  # when the last step ended by the simulated clock; None after idling
        while True:
            if not self._waiting and not self._running:
                self._wakeup.clear()
                await self._wakeup.wait()
                ended = None
                continue
            # The work done since the last step ended (handing out tokens, admitting) is part of this
            # step's simulated duration, as an engine's own overhead is part of its profiled timings.
            now = loop.time()
            start = now if ended is None else min(now, ended)
            prefill_s, prefilled = self._admit()
            mixed = self.settings.enable_mixed_chunk
            decode_s = 0.0
            if mixed or not prefilled:
                kv_tokens = sum(self.kvs[s.rank].seq_tokens(s.key) for s in self._running)
                decode_s = self.timing.decode_step_s(len(self._running) - len(prefilled), kv_tokens)
            advancing, step_s = batch_step(
                self._running, prefilled, prefill_s, mixed_chunk=mixed, decode_s=decode_s
            )
            self._publish_load()
            ended = start + step_s
            await asyncio.sleep(max(0.0, ended - loop.time()))
            for seq in list(advancing):
                if not seq.finished:
                    self._advance(seq)
            self._publish_load()

    def _admit(self) -> tuple[float, list[Seq]]:
        """Move waiting requests into the batch (``scheduler.admit``). Returns the prefill time and the
        requests prefilled."""
        prefills: list[tuple[int, int]] = []  # (uncached, cached) tokens of each request prefilled
        loaded = 0  # tokens loaded back from host memory (HiCache host hits)
        prefilled: list[Seq] = []
        s = self.settings
        decisions = admit(
            self._waiting,
            self._running,
            self.kvs,
            self.loras,
            prefill_budget=s.prefill_budget,
            max_running=s.max_running_requests,
        )
        for decision in decisions:
            seq = decision.seq
            if isinstance(decision, Refuse):
                self._fail(
                    seq, "invalid_request", "the KV cache cannot hold this request; raise --num-kv-blocks"
                )
                continue
            self._kv_events(decision.events, seq.rank)
            self._join(seq)
            if decision.prefill is not None:
                prefills.append(decision.prefill)
                loaded += decision.loaded
                prefilled.append(seq)
        step_s = self.timing.prefill_batch_s(prefills) + self.timing.load_back_s(loaded)
        return step_s + self._lora_swap_s(), prefilled

    def _join(self, seq: Seq) -> None:
        """``seq`` joins the running batch; a transferred first token goes out at once."""
        self._running.append(seq)
        if seq.kv_ready and seq.preset_first is not None and not seq.generated:
            self._advance(seq)

    def _lora_swap_s(self) -> float:
        """The time this step spends copying the batch's adapters into the GPU slots."""
        if self.loras is None or not self._running:
            return 0.0
        copied = self.loras.bring_in({s.lora for s in self._running})
        return copied * self.settings.lora_swap_ms / 1e3 / self.settings.speedup

    def _advance(self, seq: Seq) -> None:
        """Give ``seq`` its next token (or finish it)."""
        state = seq.digest if seq.state is None else seq.state
        token = next_token(seq, state, self.sampler, self.settings.eos_probability)
        if token is None:
            self._finish(seq, [], "stop")
            return
        seq.generated.append(token)
        seq.state = next_state(state, token)
        logprobs = self._logprobs(seq, state, token)
        if len(seq.generated) >= seq.max_new:
            self._finish(seq, [token], "length", logprobs)
            return
        events = self.kvs[seq.rank].append(seq.key, token)
        if events is None:
            self._preempt(seq)
        else:
            self._kv_events(events, seq.rank)
        seq.out.put(token, logprobs, hands_over(len(seq.generated), seq.request.stream_interval))

    def _logprobs(self, seq: Seq, state: int, token: int) -> list[TokenLogprob] | None:
        k = seq.request.logprobs
        if k is None:
            return None
        alternatives = [self.sampler.token(state ^ (j + 1), 0) for j in range(k + 1)]
        return [token_logprobs(token, alternatives, self.sampler.chance(state, 0), k)]

    def _finish(
        self, seq: Seq, tokens: list[int], reason: FinishReason, logprobs: list[TokenLogprob] | None = None
    ) -> None:
        seq.finished = True
        self._release(seq)
        usage = Usage(
            prompt_tokens=len(seq.request.token_ids),
            completion_tokens=len(seq.generated),
            cached_tokens=seq.cached_tokens or 0,
            cached_tokens_host=seq.host_cached_tokens,
        )
        logprobs = logprobs if tokens else None
        seq.out.put_final(
            GenerateChunk(token_ids=tokens, finish_reason=reason, usage=usage, logprobs=logprobs)
        )

    def _fail(self, seq: Seq, error_type: ErrorType, message: str) -> None:
        seq.finished = True
        self._release(seq)
        seq.out.put_final(_error(error_type, message))

    def _preempt(self, seq: Seq) -> None:
        log.info("Preempted request request_id=%s (KV cache full)", seq.request.request_id)
        self._release(seq)
        seq.tokens = [*seq.request.token_ids, *seq.generated]
        seq.kv_ready = False
        self._waiting.appendleft(seq)

    def _release(self, seq: Seq) -> None:
        self.kvs[seq.rank].free(seq.key)
        self.handoff.freed.set()
        if seq in self._running:
            self._running.remove(seq)
        if seq.lora is not None and self._lora_drained is not None:
            self._lora_drained.set()

    def _drop(self, seq: Seq) -> None:
        """The client went away: forget the request and free its blocks now."""
        seq.finished = True
        self._release(seq)
        with contextlib.suppress(ValueError):
            self._waiting.remove(seq)
        self._publish_load()

    # --- events ----------------------------------------------------------------------------------

    def _kv_events(self, events: Sequence[KvEvent], rank: int = 0) -> None:
        # A decode worker publishes none: SGLang's decode radix cache is off by default
        # (--disaggregation-decode-enable-radix-cache), so its blocks serve no prefix for a router.
        if events and self.role != "decode":
            self._sink.kv_events(events, rank)

    def _publish_load(self) -> None:
        """Report the load as SGLang does (``sglang.load.snapshot``): ``waiting`` counts the handoff
        queues too, queued prefill tokens are the waiting requests' uncached ones (and a prefill
        worker's bootstrap queue, whole)."""
        q = self.handoff.queues
        snap = LoadSnapshot(
            active_blocks=sum(kv.active_blocks for kv in self.kvs),
            total_blocks=sum(kv.total_blocks for kv in self.kvs),
            waiting=len(self._waiting)
            + q["bootstrap"]
            + q["prealloc"]
            + q["transfer"] * (self.role == "decode"),
            running=len(self._running),
            waiting_prefill_tokens=sum(s.queued_tokens for s in self._waiting if not s.finished)
            + self.handoff.bootstrap_tokens,
            bootstrap_queue=q["bootstrap"],
            prealloc_queue=q["prealloc"],
            transfer_queue=q["transfer"],
        )
        if snap != self._last_load:
            self._last_load = snap
            self._sink.load(snap)
