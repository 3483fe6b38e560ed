"""``SglangEngine``: an in-process ``sglang.Engine`` behind the runtime's ``Engine`` interface.

Startup (``start``): SGLang's constructor blocks until the model is loaded, so it runs in a thread
(bounded by ``--engine-start-timeout-s``) while the event loop keeps ``/live`` answering. SGLang's
tokenizer manager then installs its own SIGTERM handler on our loop when it first runs; we start it
eagerly and put the runtime's handler back, so graceful shutdown stays ours.

More: docs/module-notes.md (dynamo_worker.sglang.engine)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from pathlib import Path
from typing import Any

from dynamo_api.errors import DynamoError
from prometheus_client import CollectorRegistry, Gauge

from dynamo_worker.protocol import (
    GenerateChunk,
    GenerateRequest,
    ImageEmbedding,
    Role,
    ServingFeatures,
    WorkerError,
)
from dynamo_worker.runtime.aio import cancel_and_wait
from dynamo_worker.runtime.engine import (
    Engine,
    EngineEventSink,
    EngineInfo,
    EngineProcess,
    NullEventSink,
)
from dynamo_worker.runtime.lora_checks import (
    DUMMY_WEIGHTS_LOG,
    LoraError,
    LoraLimits,
    StartupAdapter,
    normalize_targets,
    parse_lora_paths,
)
from dynamo_worker.sglang import handler
from dynamo_worker.sglang.args import WorkerPlan, kv_event_endpoints, lora_blocked, pick_free_port
from dynamo_worker.sglang.images import image_item, image_prompt, image_tokens
from dynamo_worker.sglang.kv_events import KvEventRelay
from dynamo_worker.sglang.resolved import resolved_args
from dynamo_worker.sglang.transport import TransportWatch, observation_env

__all__ = [
    "EngineStartError",
    "SglangEngine",
    "canary",
    "diagnose",
    "kill_sglang_children",
    "process_name",
    "sglang_engine",
    "snapshot",
]

from dynamo_worker.sglang.load import snapshot
from dynamo_worker.sglang.probes import (
    WARMUP_PROMPTS,
    canary,
    diagnose,
    embedding_canary,
    embedding_input,
    warm_up,
)
from dynamo_worker.sglang.processes import (
    _cmdline,
    _model_dir,
    _release_in_process_parts,
    _restore_signal_handlers,
    _signal_handlers,
    kill_sglang_children,
    process_name,
    sglang_engine,
)

log = logging.getLogger(__name__)

BOOTSTRAP_PORT_ATTEMPTS = 3


class EngineStartError(DynamoError, RuntimeError):
    """SGLang did not come up; the message says what to change."""


_ROLES: dict[str, Role] = {"null": "agg", "prefill": "prefill", "decode": "decode"}


def role_of(disaggregation_mode: str) -> Role:
    return _ROLES[disaggregation_mode]


def _load_gauges(registry: CollectorRegistry) -> dict[str, Gauge]:
    def gauge(name: str, doc: str) -> Gauge:
        return Gauge(f"dynamo_sglang_{name}", doc, ["dp_rank"], registry=registry)

    return {
        "num_running_reqs": gauge("running_requests", "Requests SGLang is running (per dp rank)."),
        "num_waiting_reqs": gauge("waiting_requests", "Requests queued in SGLang's scheduler."),
        "num_used_tokens": gauge("used_kv_tokens", "KV cache tokens in use."),
        "max_total_num_tokens": gauge("total_kv_tokens", "KV cache capacity in tokens."),
        "token_usage": gauge("kv_usage_ratio", "Fraction of the KV cache in use."),
        "gen_throughput": gauge("gen_throughput_tokens_per_s", "Decode throughput SGLang measured."),
        "cache_hit_rate": gauge("cache_hit_rate", "Prefix cache hit rate SGLang measured."),
    }


class SglangEngine(Engine):
    """Serves one role (agg, prefill, decode) on an in-process SGLang engine."""

    def __init__(
        self,
        plan: WorkerPlan,
        *,
        engine_factory: Callable[[Any], Any] | None = None,
        kill_children: Callable[[], None] | None = None,
    ) -> None:
        self.plan = plan
        self.server_args = plan.server_args  # replaced by a new one when the bootstrap port is retried
        self.role = role_of(plan.server_args.disaggregation_mode)
        self._factory = engine_factory or sglang_engine
        self._kill_children = kill_children or kill_sglang_children
        self._engine: Any = None
        self._sink: EngineEventSink = NullEventSink()
        self._tasks: list[asyncio.Task[None]] = []
        self._relay: KvEventRelay | None = None
        self._gauges: dict[str, Gauge] = {}
        self._page_size = 1
        self._canary_error: str | None = None
        self._registry: CollectorRegistry | None = None
        self._transport: TransportWatch | None = None
        self._report_death: Callable[[str], None] | None = None
        self._serving = False  # started, not stopped: a SIGQUIT from SGLang is then the engine's death
        self._loras: set[str] = set()  # adapters this worker serves (SGLang may hold more it once loaded)

    # --- lifecycle -------------------------------------------------------------------------------

    def attach_events(self, sink: EngineEventSink) -> None:
        self._sink = sink

    def attach_death(self, report: Callable[[str], None]) -> None:
        self._report_death = report

    def processes(self) -> list[EngineProcess]:
        """SGLang's schedulers, data-parallel controller and detokenizer(s), by the titles they set."""
        if self._engine is None:
            return []
        init = getattr(self._engine, "_scheduler_init_result", None)
        pids = [int(p) for p in getattr(init, "all_child_pids", None) or ()]
        return [EngineProcess(process_name(_cmdline(pid), pid), pid) for pid in dict.fromkeys(pids)]

    def _sigquit(self) -> None:
        """SGLang's children and watchdogs send SIGQUIT when one of its processes failed or hangs."""
        reason = "SGLang signalled that one of its processes failed or hangs (SIGQUIT; see its log above)"
        if self._serving and self._report_death is not None:
            self._report_death(reason)
        else:
            log.error("%s while the engine is not serving", reason)

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """Add SGLang's own load figures (per dp rank) to the worker's ``/metrics`` registry."""
        self._gauges = _load_gauges(registry)
        self._registry = registry

    async def start(self) -> EngineInfo:
        blocked = lora_blocked(self.plan.server_args)
        if blocked is not None:
            log.error(DUMMY_WEIGHTS_LOG, blocked)
        self._observe_transport()
        for attempt in range(1, BOOTSTRAP_PORT_ATTEMPTS + 1):
            await self._start_engine()
            if self.role != "prefill" or not self.plan.bootstrap_port_chosen or self._bootstrap_bound():
                break
            if attempt == BOOTSTRAP_PORT_ATTEMPTS:
                raise EngineStartError(
                    f"SGLang's bootstrap server could not bind a free port {attempt} times; pass a port "
                    "that is free with --disaggregation-bootstrap-port"
                )
            if self.plan.build_server_args is None:
                raise EngineStartError(
                    "SGLang's bootstrap server could not bind the port chosen for it and this worker "
                    "cannot build new server arguments; pass a free --disaggregation-bootstrap-port"
                )
            failed = resolved_args(self.server_args)
            port = pick_free_port(failed.host)
            await self._shutdown_engine()
            self.server_args = self.plan.build_server_args({"disaggregation_bootstrap_port": port})
            log.warning(
                "Bootstrap port was taken port=%s; restarting SGLang on port=%s",
                failed.disaggregation_bootstrap_port,
                port,
            )
        cfg = resolved_args(self.server_args)
        self._page_size = cfg.page_size
        totals = await self._capacity(cfg.dp_ranks)
        await self._warm_up(totals.get("context_length") or None)
        self._serving = True
        info = EngineInfo(
            model_name=cfg.served_model_name,
            page_size=self._page_size,
            total_kv_blocks=totals["max_total_num_tokens"] // self._page_size,
            max_running_requests=totals.get("max_running_requests") or None,
            bootstrap_host=self.plan.bootstrap_host if self.role == "prefill" else None,
            bootstrap_port=cfg.disaggregation_bootstrap_port if self.role == "prefill" else None,
            dp_size=cfg.dp_ranks,
            model_dir=await asyncio.to_thread(_model_dir, cfg.tokenizer_path),
            context_length=totals.get("context_length") or None,
            features=self._features(),
            nnodes=int(self.server_args.nnodes or 1),
        )
        self._tasks.append(asyncio.create_task(self._poll_load(), name="sglang-load"))
        self._tasks.append(asyncio.create_task(self._canary_loop(), name="sglang-canary"))
        if self._transport is not None:
            self._transport.start()
        endpoints = kv_event_endpoints(cfg.kv_events_config, cfg.dp_ranks)
        if endpoints:
            self._relay = KvEventRelay(endpoints, self._sink.kv_events)
            self._relay.start()
            if self.lora_limits() is not None and not kv_events_name_adapters():
                log.warning(
                    "This SGLang's KV events do not name the LoRA adapter of a block (0.5.23 does), so "
                    "the KV router counts an adapter's cached prefixes as the base model's on this worker "
                    "and routes adapter requests on its own predictions and load; upgrade SGLang for "
                    "adapter-aware events"
                )
        self._loras = {a.name for a in self.startup_loras()}
        log.info(
            "Started SGLang engine role=%s page_size=%s total_kv_blocks=%s max_running_requests=%s "
            "dp_size=%s bootstrap=%s:%s",
            self.role,
            info.page_size,
            info.total_kv_blocks,
            info.max_running_requests,
            info.dp_size,
            info.bootstrap_host,
            info.bootstrap_port,
        )
        return info

    # --- LoRA --------------------------------------------------------------------------------------

    def lora_limits(self) -> LoraLimits | None:
        server_args = self.plan.server_args
        if not (server_args.enable_lora or server_args.lora_paths):
            return None
        targets = server_args.lora_target_modules
        return LoraLimits(
            max_loras_per_batch=int(server_args.max_loras_per_batch),
            max_loaded_loras=server_args.max_loaded_loras,
            max_lora_rank=server_args.max_lora_rank,
            target_modules=normalize_targets(targets if isinstance(targets, str) else list(targets))
            if targets
            else None,
            cannot_load=lora_blocked(server_args),
        )

    def startup_loras(self) -> list[StartupAdapter]:
        return parse_lora_paths(self.plan.server_args.lora_paths)

    async def load_lora(self, name: str, path: str, pinned: bool) -> list[str]:
        try:
            result = await self._engine.async_load_lora_adapter(lora_name=name, lora_path=path, pinned=pinned)
        except (ValueError, AssertionError, RuntimeError) as e:  # SGLang's refusals that it raises
            raise lora_refusal(name, str(e)) from None
        message = str(result.error_message or "no reason given")
        if not result.success and not ("already loaded" in message and name not in self._loras):
            raise lora_refusal(name, message)
        # (SGLang holding a name this worker does not list: a load of ours that passed its bound and
        # finished later; only this worker loads adapters into its engine, so it is the one asked for.)
        loaded = set(result.loaded_adapters or ()) if result.success else self._loras | {name}
        self._loras = loaded & (self._loras | {name})
        return sorted(self._loras)

    async def unload_lora(self, name: str) -> list[str]:
        self._loras.discard(name)  # refused from now on, also while SGLang waits for its running requests
        try:
            result = await self._engine.async_unload_lora_adapter(lora_name=name)
        except (ValueError, AssertionError, RuntimeError) as e:
            self._loras.add(name)
            raise lora_refusal(name, str(e)) from None
        if not result.success:
            self._loras.add(name)
            raise lora_refusal(name, str(result.error_message or "no reason given"))
        return sorted(self._loras)

    def _observe_transport(self) -> None:
        """A disaggregated worker on NIXL has UCX describe the protocols it selects into files this
        worker reads (``sglang.transport``): the KV transport in use is then logged and exported. The
        environment must be set before SGLang starts its scheduler processes, which inherit it."""
        backend = str(getattr(self.server_args, "disaggregation_transfer_backend", "") or "")
        if self.role == "agg" or backend != "nixl" or self._transport is not None:
            return
        folder = Path(tempfile.mkdtemp(prefix="dynamo-ucx-"))
        env = observation_env(os.environ, folder)
        if not env:
            shutil.rmtree(folder, ignore_errors=True)
            log.info(
                "KV transport not observed: UCX_LOG_FILE or UCX_PROTO_INFO is set here, and stays as set"
            )
            return
        os.environ.update(env)
        self._transport = TransportWatch(folder, self._registry)
        log.info(
            "KV transfers over NIXL/UCX: the transport in use (cuda_ipc, rc, tcp) is logged at the "
            "first transfer"
        )

    def _features(self) -> ServingFeatures:
        """What the model card announces: embeddings or generation, parsers, grammar backend."""
        server_args = self.plan.server_args
        config = getattr(self._engine.tokenizer_manager, "model_config", None)
        hidden = getattr(config, "hidden_size", None)
        matryoshka = getattr(config, "matryoshka_dimensions", None)
        is_embedding = bool(server_args.is_embedding)
        return ServingFeatures(
            model_type="embedding" if is_embedding else "generate",
            tool_call_parser=server_args.tool_call_parser,
            reasoning_parser=server_args.reasoning_parser,
            # SGLang turns grammars off under --skip-tokenizer-init (its GrammarManager has no tokenizer)
            grammar_backend="none"
            if server_args.skip_tokenizer_init
            else str(server_args.grammar_backend or "none"),
            embedding_dim=int(hidden) if is_embedding and isinstance(hidden, int) else None,
            is_matryoshka=bool(getattr(config, "is_matryoshka", False)),
            matryoshka_dimensions=list(matryoshka) if isinstance(matryoshka, list | tuple) else None,
        )

    async def _start_engine(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGQUIT, self._sigquit)  # SGLang's launch installs none: a thread
        before = _signal_handlers(loop)
        started = time.monotonic()
        log.info("Starting SGLang engine role=%s model=%s", self.role, self.server_args.model_path)
        try:
            async with asyncio.timeout(self.plan.settings.engine_start_timeout_s):
                self._engine = await asyncio.to_thread(self._factory, self.server_args)
        except TimeoutError:
            # SGLang's constructor waits on its schedulers; ending them ends it (and frees the GPU).
            await asyncio.to_thread(self._kill_children)
            raise EngineStartError(
                f"SGLang did not load the model within {self.plan.settings.engine_start_timeout_s:.0f}s; "
                "raise --engine-start-timeout-s or check the GPU and the model path"
            ) from None
        # SGLang's handle loop would otherwise start on the first request and take over SIGTERM.
        self._engine.tokenizer_manager.auto_create_handle_loop()
        _restore_signal_handlers(loop, before)
        log.info("SGLang engine is up seconds=%.1f", time.monotonic() - started)

    def _bootstrap_bound(self) -> bool:
        """SGLang's bootstrap server binds in a thread that only logs a failure and ends."""
        server = getattr(self._engine.tokenizer_manager, "bootstrap_server", None)
        thread = getattr(server, "thread", None)
        return thread is None or thread.is_alive()

    async def _capacity(self, dp_ranks: int) -> dict[str, int]:
        """KV capacity and max running requests, from SGLang's load snapshots (published when the
        scheduler idles; one per dp rank), or from the scheduler's startup info."""
        deadline = time.monotonic() + self.plan.settings.capacity_timeout_s
        while time.monotonic() < deadline:
            loads = await self._engine.tokenizer_manager.get_loads()
            every_rank = len(loads) >= dp_ranks
            if loads and every_rank and all(load.max_total_num_tokens > 0 for load in loads):
                return {
                    "max_total_num_tokens": sum(load.max_total_num_tokens for load in loads),
                    "max_running_requests": sum(load.max_running_requests for load in loads),
                    "context_length": int(getattr(self._engine.tokenizer_manager, "context_len", 0)) or 0,
                }
            await asyncio.sleep(0.2)
        infos = self._engine._scheduler_init_result.scheduler_infos
        log.warning("No SGLang load snapshot yet; using the scheduler's startup info for KV capacity")
        return {"max_total_num_tokens": sum(int(i["max_total_num_tokens"]) for i in infos)}

    async def stop(self) -> None:
        self._serving = False
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()
        if self._relay is not None:
            await self._relay.stop()
            self._relay = None
        await self._shutdown_engine()
        if self._transport is not None:
            await self._transport.stop()
            shutil.rmtree(self._transport.folder, ignore_errors=True)
            self._transport = None

    async def _shutdown_engine(self) -> None:
        if self._engine is not None:
            engine, self._engine = self._engine, None
            with contextlib.suppress(Exception):
                engine.tokenizer_manager.abort_request(abort_all=True)
            await asyncio.to_thread(engine.shutdown)
            await _release_in_process_parts(engine.tokenizer_manager)
            log.info("Stopped SGLang engine")

    # --- requests --------------------------------------------------------------------------------

    def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        if self._engine is None:
            raise RuntimeError("SglangEngine.generate called before start()")
        rid = f"{request.request_id}-{uuid.uuid4().hex[:8]}"
        is_embedding = bool(self.plan.server_args.is_embedding)
        if (request.embed is not None) != is_embedding:
            return _refuse(
                "this worker serves embeddings (--is-embedding); send generation to a generation model"
                if is_embedding
                else "this worker generates text; embeddings need a worker started with --is-embedding"
            )
        if request.embed is not None:
            return handler.stream_embedding(self._engine, request, rid, embedding_input)
        if request.lora_name is not None and request.lora_name not in self._loras:
            served = ", ".join(sorted(self._loras)) or "none"
            if self.lora_limits() is None:
                return _refuse(
                    f"this worker serves no LoRA adapters, so not {request.lora_name!r}; start it with "
                    "--enable-lora"
                )
            return _refuse(
                f"LoRA adapter {request.lora_name!r} is not loaded on this worker (it serves: {served}); "
                "load it with POST /v1/loras on the worker's system port"
            )
        return handler.stream_request(self._engine, request, self.role, rid, self._image_input())

    def _image_input(self) -> handler.ImageInput | None:
        """How this model's requests with images become SGLang input (None: it takes no images)."""
        config = getattr(getattr(self._engine.tokenizer_manager, "model_config", None), "hf_config", None)
        tokens = image_tokens(config) if config is not None else None
        if tokens is None:
            return None

        def build(req: GenerateRequest) -> tuple[list[int], dict[str, Any]]:
            ids, embeddings = image_prompt(req, tokens)
            return ids, image_item(embeddings, torch_tensors)

        return build

    async def health_check(self) -> None:
        """Raise unless the last canary request passed (the canary runs in the background every
        ``--canary-interval-s``, so a probe answers at once even when SGLang's queue is long)."""
        if self._engine is None:
            raise RuntimeError("SGLang engine is not running")
        if self._canary_error is not None:
            raise RuntimeError(self._canary_error)

    async def _probe(self, timeout_s: float) -> str | None:
        """One canary request (an embedding for an embedding model); None when SGLang answered."""
        if self.plan.server_args.is_embedding:
            return await embedding_canary(self._engine, timeout_s)
        return await canary(self._engine, self.role, self.plan.fake_bootstrap_host, timeout_s)

    async def _warm_up(self, context_length: int | None) -> None:
        timeout_s = self.plan.settings.warmup_timeout_s
        if timeout_s == 0:
            return
        started = time.monotonic()
        if self.plan.server_args.is_embedding:
            problem = await self._probe(timeout_s)
        else:
            problem = await warm_up(
                self._engine, self.role, self.plan.fake_bootstrap_host, timeout_s, context_length
            )
        if problem is not None:
            raise EngineStartError(
                f"SGLang did not serve its warmup requests: {problem}; check the GPU and the engine's log "
                "above, or raise --warmup-timeout-s if the first forward passes are this slow here"
            )
        log.info(
            "Warmed up SGLang seconds=%.1f requests=%d (the first forward passes compile kernels)",
            time.monotonic() - started,
            len(WARMUP_PROMPTS),
        )

    async def _canary_loop(self) -> None:
        while True:
            await asyncio.sleep(self.plan.settings.canary_interval_s)
            problem = await self._probe(self.plan.settings.canary_timeout_s)
            if problem is None:
                self._canary_error = None
                continue
            healthy, why = await diagnose(self._engine, self.role)
            if healthy:
                log.warning("SGLang canary was slow, and the engine is healthy: %s; %s", problem, why)
                self._canary_error = None
            else:
                self._canary_error = f"{problem}: {why}"
                log.warning("SGLang canary failed: %s", self._canary_error)

    # --- load and metrics ------------------------------------------------------------------------

    async def _poll_load(self) -> None:
        interval = self.plan.settings.load_interval_s
        while True:
            try:
                loads = await self._engine.tokenizer_manager.get_loads()
            except Exception as e:  # a metrics poll must never take the worker down; logged, retried
                log.warning("Could not read SGLang load error=%r", e)
                loads = []
            if loads:
                self._sink.load(snapshot(loads, self._page_size, self.role))
                for load in loads:
                    for key, gauge in self._gauges.items():
                        gauge.labels(dp_rank=str(load.dp_rank)).set(float(getattr(load, key, 0) or 0))
            await asyncio.sleep(interval)


async def _refuse(message: str) -> AsyncGenerator[GenerateChunk, None]:
    yield GenerateChunk(finish_reason="error", error=WorkerError(type="invalid_request", message=message))


# SGLang's words for its refusals of a load (``LoRAUpdateOutput.error_message``), and our reasons.
_LORA_REFUSALS = (
    ("not allowed to pin all slots", "NoFreeSlot"),
    ("when trying to evict", "NoFreeSlot"),
    ("incompatible with the current lora memory pool", "IncompatibleAdapter"),
    ("lora is not enabled", "LoraNotEnabled"),
    ("already loaded", "NameConflict"),
    ("does not exist", "NotFound"),
)


def lora_refusal(name: str, message: str) -> LoraError:
    """SGLang's refusal of a load or unload of adapter ``name``, as our ``LoraError``."""
    lowered = message.lower()
    reason = next((r for words, r in _LORA_REFUSALS if words in lowered), "LoadFailed")
    return LoraError(reason, f"SGLang refused adapter {name!r}: {message}")


def kv_events_name_adapters() -> bool:
    """Whether the installed SGLang's ``BlockStored`` KV event names the adapter (``lora_name``)."""
    from sglang.srt.disaggregation.kv_events import BlockStored

    return "lora_name" in getattr(BlockStored, "__struct_fields__", ())


def torch_tensors(embeddings: Sequence[ImageEmbedding]) -> tuple[Any, Any]:
    """The embeddings concatenated as one (tokens, hidden) tensor, and their (t, h, w) grids (or None)."""
    import torch

    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
    features = torch.cat(
        [
            torch.frombuffer(bytearray(base64.b64decode(e.data)), dtype=dtype[e.dtype]).view(
                e.num_tokens, e.hidden_size
            )
            for e in embeddings
        ]
    )
    grids = [e.grid_thw for e in embeddings]
    if any(g is None for g in grids):
        return features, None
    return features, torch.tensor(grids, dtype=torch.long)
