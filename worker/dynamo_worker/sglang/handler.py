"""One request on an in-process SGLang engine: ``GenerateRequest`` in, ``GenerateChunk`` stream out.

More: docs/module-notes.md (dynamo_worker.sglang.handler)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any, Protocol

from dynamo_worker.protocol import (
    ErrorType,
    GenerateChunk,
    GenerateRequest,
    Role,
    TokenLogprob,
    TopLogprob,
    Usage,
    WorkerError,
    embedding_chunks,
)

log = logging.getLogger(__name__)

__all__ = [
    "AsyncGenerateEngine",
    "chunk_tokens",
    "embed_kwargs",
    "finish_from_meta",
    "generate_kwargs",
    "logprobs_from_meta",
    "sampling_params",
    "stream_embedding",
    "stream_request",
    "usage_from_meta",
]


class _TokenizerManager(Protocol):
    def abort_request(self, rid: str = "", abort_all: bool = False) -> None: ...


class AsyncGenerateEngine(Protocol):
    """The part of ``sglang.srt.entrypoints.engine.Engine`` a request uses."""

    tokenizer_manager: _TokenizerManager

    async def async_generate(self, **kwargs: Any) -> Any: ...


def sampling_params(req: GenerateRequest, role: Role) -> dict[str, Any]:
    """SGLang ``sampling_params`` for ``req``. A prefill leg computes the prompt and one token only."""
    s, stop = req.sampling, req.stop
    stop_ids = sorted(set(stop.stop_token_ids) | (set() if stop.ignore_eos else set(req.eos_token_ids)))
    return {
        "max_new_tokens": 1 if role == "prefill" else stop.max_tokens,
        "min_new_tokens": 0 if role == "prefill" else min(stop.min_tokens, stop.max_tokens),
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "frequency_penalty": s.frequency_penalty,
        "presence_penalty": s.presence_penalty,
        "sampling_seed": s.seed,
        "stop_token_ids": stop_ids or None,
        "ignore_eos": stop.ignore_eos,
        "json_schema": req.structured.json_schema if req.structured else None,
        "regex": req.structured.regex if req.structured else None,
        "ebnf": req.structured.ebnf if req.structured else None,
        "structural_tag": req.structured.structural_tag if req.structured else None,
        "stream_interval": req.stream_interval,
    }


ImageInput = Callable[[GenerateRequest], tuple[list[int], dict[str, Any]]]


def generate_kwargs(
    req: GenerateRequest, role: Role, rid: str, images: ImageInput | None = None
) -> dict[str, Any]:
    """Keyword arguments of the ``engine.async_generate`` call that serves ``req``. ``images`` turns a
    request with image spans into SGLang's ``input_ids`` and its one ``image_data`` item
    (``dynamo_worker.sglang.images``); None for a model that takes no images."""
    boot = req.bootstrap_info
    if role in ("prefill", "decode") and boot is None:
        raise ValueError(f"a {role} leg needs bootstrap_info (host, port, room) from the frontend")
    input_ids, image_data = list(req.token_ids), None
    if req.images:  # never generate from the pad ids alone: that would silently ignore the images
        if images is None:
            raise ValueError(
                "this worker's model takes no images (its config has no image token id); send text "
                "only, or serve a vision-language model"
            )
        input_ids, item = images(req)
        image_data = [item]
    return _call_kwargs(
        input_ids=input_ids,
        image_data=image_data,
        sampling_params=sampling_params(req, role),
        stream=True,
        rid=rid,
        bootstrap_host=boot.bootstrap_host if boot and role != "agg" else None,
        bootstrap_port=boot.bootstrap_port if boot and role != "agg" else None,
        bootstrap_room=boot.bootstrap_room if boot and role != "agg" else None,
        routed_dp_rank=req.data_parallel_rank,
        lora_path=req.lora_name,
        return_logprob=True if req.logprobs is not None and role != "prefill" else None,
        top_logprobs_num=req.logprobs if req.logprobs and role != "prefill" else None,
        logprob_start_len=-1 if req.logprobs is not None and role != "prefill" else None,
    )


def canary_kwargs(
    role: Role,
    rid: str,
    fake_bootstrap_host: str,
    input_ids: Sequence[int] = (0,),
    max_new_tokens: int = 1,
    sampling: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A request of the engine's own: by default one token in and one out, greedy, which proves the
    scheduler answers (the canary); the warm-up sends longer ones, some sampled (``sampling``: SGLang
    sampling parameters). Disaggregated roles address the fake bootstrap host, for which SGLang skips
    the KV transfer (as its own ``/health_generate`` does)."""
    disagg = role != "agg"
    params = {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True, **(sampling or {})}
    return _call_kwargs(
        input_ids=list(input_ids),
        sampling_params=params,
        stream=True,
        rid=rid,
        bootstrap_host=fake_bootstrap_host if disagg else None,
        bootstrap_port=None,
        bootstrap_room=0 if disagg else None,
        routed_dp_rank=None,
    )


def _call_kwargs(**kwargs: Any) -> dict[str, Any]:
    """Drop the unset keywords so SGLang applies its own defaults."""
    return {k: v for k, v in kwargs.items() if v is not None}


async def call_async_generate(engine: AsyncGenerateEngine, kwargs: Mapping[str, Any]) -> Any:
    """The one place that calls SGLang's ``async_generate``; its keywords come from the builders above.
    ``compat`` checks every keyword those builders pass against SGLang's signature."""
    return await engine.async_generate(**kwargs)


def finish_from_meta(meta: Mapping[str, Any]) -> tuple[str | None, WorkerError | None]:
    """Map SGLang's ``meta_info["finish_reason"]`` to ours: None while running; ``stop`` (a stop
    token or eos), ``length``; an ``abort`` becomes an ``error`` chunk with a typed error."""
    reason = meta.get("finish_reason")
    if reason is None:
        return None, None
    kind = reason.get("type") if isinstance(reason, Mapping) else str(reason)
    if kind in ("stop", "length"):
        return kind, None
    message = str(reason.get("message") or "aborted") if isinstance(reason, Mapping) else str(reason)
    return "error", WorkerError(type=_error_type(reason, message), message=f"SGLang aborted: {message}")


def _error_type(reason: Any, message: str) -> ErrorType:
    """SGLang's disaggregation aborts say "... bootstrap failed", "... handshake failed" or "... transfer
    failed" (sglang.srt.disaggregation); a 400 status is the caller's fault."""
    status = reason.get("status_code") if isinstance(reason, Mapping) else None
    lowered = message.lower()
    if ("bootstrap" in lowered or "handshake" in lowered) and "timeout" in lowered:
        return "bootstrap_timeout"
    if any(word in lowered for word in ("bootstrap failed", "handshake failed", "transfer failed")):
        return "bootstrap_failed"
    if status == 400:
        return "invalid_request"
    return "engine_error"


def usage_from_meta(meta: Mapping[str, Any]) -> Usage:
    """Usage from SGLang's ``meta_info``. With HiCache, ``cached_tokens`` counts every tier and
    ``cached_tokens_details`` ({"device", "host"[, "storage"]}) splits it: host and storage are ours
    ``cached_tokens_host``."""
    cached = int(meta.get("cached_tokens") or 0)
    details = meta.get("cached_tokens_details")
    lower = 0
    if isinstance(details, Mapping):
        lower = sum(int(details.get(k) or 0) for k in ("host", "storage"))
    return Usage(
        prompt_tokens=int(meta.get("prompt_tokens") or 0),
        completion_tokens=int(meta.get("completion_tokens") or 0),
        cached_tokens=cached,
        cached_tokens_host=min(lower, cached),
    )


def logprobs_from_meta(meta: Mapping[str, Any], count: int) -> list[TokenLogprob] | None:
    """The first ``count`` output tokens' logprobs of this chunk (``None`` when SGLang sent none)."""
    chosen = meta.get("output_token_logprobs")
    if not chosen:
        return None
    tops = meta.get("output_top_logprobs") or []
    out = []
    for i, (logprob, token_id, *_) in enumerate(chosen[:count]):
        top = tops[i] if i < len(tops) and tops[i] else []
        out.append(
            TokenLogprob(
                token_id=int(token_id),
                logprob=float(logprob) if logprob is not None else -9999.0,
                top=[
                    TopLogprob(token_id=int(t[1]), logprob=float(t[0]) if t[0] is not None else -9999.0)
                    for t in top
                ],
            )
        )
    return out


def embed_kwargs(req: GenerateRequest, rid: str) -> dict[str, Any]:
    """Fields of the ``EmbeddingReqInput`` that serves an embedding request (always a batch)."""
    assert req.embed is not None
    inputs = [list(i) for i in req.embed.inputs]
    return {
        "input_ids": inputs,
        "rid": [f"{rid}-{i}" for i in range(len(inputs))],
        "dimensions": req.embed.dimensions,
    }


async def stream_embedding(
    engine: AsyncGenerateEngine, req: GenerateRequest, rid: str, make_input: Any
) -> AsyncGenerator[GenerateChunk, None]:
    """One chunk with every input's vector (``make_input`` builds SGLang's ``EmbeddingReqInput``)."""
    kwargs = embed_kwargs(req, rid)
    finished = False
    try:
        outputs = engine.tokenizer_manager.generate_request(make_input(**kwargs), None)  # type: ignore[attr-defined]
        try:
            result = await anext(outputs)
        except ValueError as e:  # too long, bad dimensions: the caller's fault
            finished = True
            yield _invalid(str(e))
            return
        finally:
            with contextlib.suppress(Exception):
                await outputs.aclose()
        finished = True
        results = result if isinstance(result, list) else [result]
        vectors = [_floats(r["embedding"]) for r in results]
        tokens = sum(int((r.get("meta_info") or {}).get("prompt_tokens") or 0) for r in results)
        for chunk in embedding_chunks(vectors, Usage(prompt_tokens=tokens, completion_tokens=0)):
            yield chunk
    finally:
        if not finished:
            for one in kwargs["rid"]:
                engine.tokenizer_manager.abort_request(one)


def _floats(value: Any) -> list[float]:
    if hasattr(value, "tolist"):
        value = value.tolist()
    return [float(v) for v in value]


def chunk_tokens(output_ids: list[int], meta: Mapping[str, Any]) -> list[int]:
    """The ids to stream from one output: SGLang returns the stop token that ended generation; our
    protocol does not (the frontend must not print an eos)."""
    reason = meta.get("finish_reason")
    matched = reason.get("matched") if isinstance(reason, Mapping) else None
    if isinstance(matched, int) and output_ids and output_ids[-1] == matched:
        return output_ids[:-1]
    return output_ids


def _invalid(message: str) -> GenerateChunk:
    return GenerateChunk(finish_reason="error", error=WorkerError(type="invalid_request", message=message))


async def _validated(
    outputs: AsyncGenerator[dict[str, Any], None],
) -> AsyncGenerator[dict[str, Any] | GenerateChunk, None]:
    """SGLang raises ``ValueError`` from the first step for a request it cannot take (too long, bad
    sampling values); that is the caller's fault and becomes an ``invalid_request`` error chunk."""
    async with contextlib.aclosing(outputs):
        try:
            async for out in outputs:
                yield out
        except ValueError as e:
            yield _invalid(str(e))


async def stream_request(
    engine: AsyncGenerateEngine, req: GenerateRequest, role: Role, rid: str, images: ImageInput | None = None
) -> AsyncGenerator[GenerateChunk, None]:
    """Serve ``req`` on ``engine`` under SGLang request id ``rid``; aborts it unless it finished."""
    try:
        kwargs = generate_kwargs(req, role, rid, images)
    except ValueError as e:
        yield _invalid(str(e))
        return
    finished = False

    def abort_unless_finished() -> None:
        nonlocal finished
        if not finished:
            finished = True
            log.info("Aborting SGLang request rid=%s (caller went away)", rid)
            engine.tokenizer_manager.abort_request(rid)

    try:
        try:
            outputs = await call_async_generate(engine, kwargs)
        except ValueError as e:  # e.g. a data_parallel_rank outside SGLang's dp size
            finished = True
            yield _invalid(str(e))
            return
        async with contextlib.aclosing(_validated(outputs)) as stream:
            try:
                async for out in stream:
                    if isinstance(out, GenerateChunk):  # refused before it was queued
                        finished = True
                        yield out
                        return
                    meta = out.get("meta_info") or {}
                    reason, error = finish_from_meta(meta)
                    tokens = chunk_tokens(list(out.get("output_ids") or ()), meta)
                    logprobs = logprobs_from_meta(meta, len(tokens)) if req.logprobs is not None else None
                    if reason is None:
                        if tokens:
                            yield GenerateChunk(token_ids=tokens, logprobs=logprobs)
                        continue
                    finished = True
                    if error is not None:
                        log.warning(
                            "SGLang aborted request rid=%s type=%s: %s", rid, error.type, error.message
                        )
                        yield GenerateChunk(finish_reason="error", error=error)
                    else:
                        usage = usage_from_meta(meta)
                        logprobs = logprobs if tokens else None
                        yield GenerateChunk(
                            token_ids=tokens, finish_reason=reason, usage=usage, logprobs=logprobs
                        )
                    return
            except BaseException:  # cancelled or closed by the caller (GeneratorExit), or a failure
                # Abort while SGLang's generator is still open: closing it first makes SGLang drop
                # the request on its own in 0.5.17, but the explicit abort is what its API promises.
                abort_unless_finished()
                raise
        finished = True
        yield GenerateChunk(
            finish_reason="error",
            error=WorkerError(type="engine_error", message="SGLang ended the stream without a finish reason"),
        )
    finally:
        abort_unless_finished()
