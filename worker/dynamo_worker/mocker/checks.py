"""The mocker's request checks, pure: what it refuses before a request is queued (``check_request``:
shutting down, the context length, the KV cache, the data-parallel rank, images, bootstrap info) and a
request of the wrong kind (``check_kind``: generation on an embedding worker, or the reverse), an
adapter it does not serve (``check_lora``); and, at start, the LoRA flags and ``--lora-paths`` adapters
(``start_loras``, which reads their configs)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

from dynamo_worker.mocker.kv_manager import BlockManager
from dynamo_worker.mocker.lora import MockLoras
from dynamo_worker.mocker.scheduler import error_chunk as _error
from dynamo_worker.mocker.settings import MockerSettings
from dynamo_worker.protocol import GenerateChunk, GenerateRequest, image_pad_id
from dynamo_worker.runtime.lora_checks import (
    DUMMY_WEIGHTS_LOG,
    LoraError,
    LoraLimits,
    StartupAdapter,
    check_fits,
    dummy_weights_block,
    effective_limits,
    normalize_targets,
    parse_lora_paths,
    read_adapter_config,
)
from dynamo_worker.runtime.worker import WorkerStartError

__all__ = ["check_kind", "check_lora", "check_request", "start_loras"]

log = logging.getLogger(__name__)


def check_request(
    request: GenerateRequest,
    settings: MockerSettings,
    *,
    stopping: bool,
    context_length: int,
    kv: BlockManager,
    bootstrap_port: int | None,
) -> GenerateChunk | None:
    """The error chunk that refuses ``request`` before it is queued, as SGLang would refuse it, or None."""
    n = len(request.token_ids)
    if stopping:
        return _error("shutting_down", "worker is shutting down")
    if n >= context_length:
        return _error(
            "invalid_request",
            f"prompt has {n} tokens; the context length is {context_length}: shorten the prompt",
        )
    if kv.blocks_needed(n + 1) > kv.total_blocks:
        return _error(
            "invalid_request",
            f"prompt needs {kv.blocks_needed(n + 1)} KV blocks but the cache has "
            f"{kv.total_blocks}; raise --num-kv-blocks",
        )
    if request.data_parallel_rank is not None and request.data_parallel_rank >= settings.dp_size:
        return _error("invalid_request", f"data_parallel_rank must be below dp_size={settings.dp_size}")
    for i, span in enumerate(request.images):  # the pad ids stand for the image, as in SGLang
        pad = image_pad_id(span.embedding.content_hash)
        end = span.offset + span.embedding.num_tokens
        if any(t != pad for t in request.token_ids[span.offset : end]):
            return _error("invalid_request", f"images[{i}]: its token_ids are not its pad id {pad}")
    if settings.role != "agg" and request.bootstrap_info is None:
        return _error("invalid_request", f"a {settings.role} worker needs bootstrap_info in the request")
    if settings.role == "prefill" and bootstrap_port is not None:
        port = request.bootstrap_info.bootstrap_port  # type: ignore[union-attr]
        if port != bootstrap_port:
            return _error(
                "invalid_request",
                f"bootstrap_port {port} is not this prefill worker's bootstrap port {bootstrap_port}",
            )
    return None


def check_kind(
    request: GenerateRequest, settings: MockerSettings, *, embedding_dim: int, context_length: int
) -> GenerateChunk | None:
    """The error chunk for a generation request to an embedding worker or the reverse, or None."""
    if settings.is_embedding and request.embed is None:
        return _error(
            "invalid_request",
            "this worker serves embeddings (--is-embedding); send generation to a generation model",
        )
    if request.embed is not None:
        if not settings.is_embedding:
            return _error("invalid_request", "this worker generates text; start it with --is-embedding")
        dims = request.embed.dimensions
        if dims is not None and dims > embedding_dim:
            return _error("invalid_request", f"dimensions {dims} exceeds the size {embedding_dim}")
        for ids in request.embed.inputs:
            if len(ids) > context_length:
                return _error(
                    "invalid_request",
                    f"an input has {len(ids)} tokens; the context length is {context_length}",
                )
    return None


def check_lora(request: GenerateRequest, loras: MockLoras | None) -> GenerateChunk | None:
    """The error chunk for an adapter this worker does not serve, or None (the adapter's use counted)."""
    name = request.lora_name
    if name is None:
        return None
    if loras is None:
        return _error(
            "invalid_request",
            f"this worker serves no LoRA adapters, so not {name!r}; start it with --enable-lora",
        )
    if not loras.serves(name):
        held = ", ".join(n for n in loras.held if loras.serves(n)) or "none"
        return _error(
            "invalid_request",
            f"LoRA adapter {name!r} is not loaded on this worker (it serves: {held}); load it with "
            "POST /v1/loras on the worker's system port",
        )
    loras.use(name)
    return None


async def start_loras(settings: MockerSettings, loras: MockLoras) -> tuple[LoraLimits, list[StartupAdapter]]:
    """Check the flags and the ``--lora-paths`` adapters as SGLang does when it starts, and hold them in
    ``loras``: the limits the worker reports and the adapters it starts with."""
    s = settings
    try:
        startup = parse_lora_paths(s.lora_paths)
    except ValueError as e:
        raise WorkerStartError(str(e)) from None
    flags = LoraLimits(
        max_loras_per_batch=s.max_loras_per_batch,
        max_loaded_loras=s.max_loaded_loras,
        max_lora_rank=s.max_lora_rank,
        target_modules=normalize_targets(s.lora_target_modules) if s.lora_target_modules else None,
    )
    configs = []
    for adapter in startup:
        try:
            config = await asyncio.to_thread(read_adapter_config, Path(adapter.path))
            check_fits(adapter.name, config, flags)
        except LoraError as e:
            raise WorkerStartError(f"--lora-paths {adapter.name}={adapter.path}: {e.message}") from None
        configs.append(config)
        loras.load(adapter.name, adapter.pinned)
    blocked = dummy_weights_block(True, s.load_format)
    if blocked is not None:
        log.error(DUMMY_WEIGHTS_LOG, blocked)
    return replace(effective_limits(flags, configs), cannot_load=blocked), startup
