"""The SGLang engine's probes: a one-token canary (``canary``, ``embedding_canary``), why one got no
answer (``diagnose``: busy, or a scheduler that stopped turning), and the warm-up a worker runs before
it registers (``warm_up``).

Before the worker registers, requests of its own warm SGLang up (``--warmup-timeout-s``, ``warm_up``): the
first forward passes load and compile kernels, seconds on a new pod, which the first user requests would
otherwise pay for. Then a canary request every ``--canary-interval-s`` proves the scheduler answers. A
canary that gets no answer in ``--canary-timeout-s`` is explained from SGLang's own queues
(``diagnose``): busy (requests running or queued for compute: /health stays 200), a stuck KV transfer
(nothing runs, yet requests wait in the bootstrap or transfer queues) or a blocked scheduler (not even a
load query answers); the last two turn /health to 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Mapping
from typing import Any

from dynamo_worker.protocol import EmbedOptions, GenerateRequest, Role, StopConditions
from dynamo_worker.sglang import handler
from dynamo_worker.sglang.load import _TRANSFER_QUEUES, _sum

__all__ = [
    "STALE_LOAD_S",
    "WARMUP_PROMPTS",
    "WARMUP_TOKENS",
    "canary",
    "diagnose",
    "embedding_canary",
    "warm_up",
]


def embedding_input(**kwargs: Any) -> Any:
    from sglang.srt.managers.io_struct import EmbeddingReqInput

    return EmbeddingReqInput(**kwargs)


async def canary(engine: Any, role: Role, fake_bootstrap_host: str, timeout_s: float) -> str | None:
    """Send a one-token request; None when SGLang answered within ``timeout_s``, else why not."""
    rid = f"canary-{uuid.uuid4().hex}"
    kwargs = handler.canary_kwargs(role, rid, fake_bootstrap_host)
    done = False
    try:
        async with asyncio.timeout(timeout_s):
            outputs = await handler.call_async_generate(engine, kwargs)
            async with contextlib.aclosing(outputs):
                async for out in outputs:
                    done = (out.get("meta_info") or {}).get("finish_reason") is not None
                    return None  # any answer from the scheduler proves it runs
        return "SGLang ended the canary stream without an answer"
    except TimeoutError:
        return f"SGLang did not answer a canary request within {timeout_s:.0f}s"
    finally:
        if not done:
            engine.tokenizer_manager.abort_request(rid)


# The warm-up's requests: prompt ids and SGLang sampling parameters. Kernels load or compile on their
# first use, so the warm-up sends what users send: prompts alone and two at once, lengths that are and are
# not multiples of 16, a cached prefix extended, and sampled requests (the OpenAI default is temperature
# 1). The sampler decided it on an H200 (2026-11-29, tests/gpu/README.md): after greedy warm-ups, one
# token or these three prompts, a user's first chat took 5-6 times the steady TTFT; with two of them
# sampled, 1.15 times.
_WARMUP_PREFIX = [1] * 64
WARMUP_PROMPTS: tuple[tuple[list[int], dict[str, float]], ...] = (
    (_WARMUP_PREFIX, {}),
    ([2] * 37, {"temperature": 1.0}),
    (_WARMUP_PREFIX + [3] * 19, {"temperature": 0.7, "top_p": 0.9, "top_k": 40}),
)
WARMUP_TOKENS = 8  # decode steps of each (a prefill leg computes one token)


async def warm_up(
    engine: Any, role: Role, fake_bootstrap_host: str, timeout_s: float, context_length: int | None
) -> str | None:
    """Serve ``WARMUP_PROMPTS`` to the end (disaggregated roles through the fake bootstrap host, like the
    canary), within ``timeout_s`` in all; None when SGLang served them, else why not. Prompts are cut
    to fit a short ``context_length``."""
    tokens = 1 if role == "prefill" else WARMUP_TOKENS
    room = max(1, (context_length or 1 << 20) - tokens - 1)
    prompts = [(ids[:room], how) for ids, how in WARMUP_PROMPTS]

    async def serve(ids: list[int], sampling: dict[str, float]) -> None:
        rid = f"engine-warmup-{uuid.uuid4().hex}"
        kwargs = handler.canary_kwargs(role, rid, fake_bootstrap_host, ids, tokens, sampling)
        meta: Mapping[str, Any] = {}
        try:
            outputs = await handler.call_async_generate(engine, kwargs)
            async with contextlib.aclosing(outputs):
                async for out in outputs:
                    meta = out.get("meta_info") or {}
                    if meta.get("finish_reason") is not None:
                        break
        finally:
            if meta.get("finish_reason") is None:
                engine.tokenizer_manager.abort_request(rid)
        kind, _ = handler.finish_from_meta(meta)
        if kind not in ("stop", "length"):  # an abort, or the stream ended without a finish
            raise RuntimeError(f"SGLang ended a warm-up request with {meta.get('finish_reason')!r}")

    try:
        async with asyncio.timeout(timeout_s):
            await serve(*prompts[0])
            await asyncio.gather(*(serve(*prompt) for prompt in prompts[1:]))
    except TimeoutError:
        return f"they did not finish within {timeout_s:g}s"
    except Exception as e:  # SGLang refused one: the engine cannot serve what users will send
        return f"{type(e).__name__}: {e}"
    return None


# A scheduler whose loop turns publishes a load snapshot at least every few batches, and on every idle
# turn (SGLang 0.5.17: ``Scheduler.publish_load_snapshot``); one older than this has stopped turning.
STALE_LOAD_S = 10.0


async def diagnose(engine: Any, role: Role, timeout_s: float = 5.0) -> tuple[bool, str]:
    """Why a canary got no answer, from SGLang's queues: (healthy, why). Busy is healthy; a scheduler
    whose loop does not turn, or that runs nothing while requests wait on KV transfers, is not."""
    blocked = "(a hung kernel, transfer call or collective), not busy"
    try:
        async with asyncio.timeout(timeout_s):
            loads = await engine.tokenizer_manager.get_loads()
    except TimeoutError:
        return (
            False,
            f"the scheduler did not answer a load query within {timeout_s:.0f}s either: blocked {blocked}",
        )
    newest = max((float(getattr(load, "timestamp", 0) or 0) for load in loads), default=0.0)
    if newest and time.time() - newest > STALE_LOAD_S:
        age = time.time() - newest
        return (
            False,
            f"the scheduler has published no load report for {age:.0f}s, so its loop is not turning: "
            f"blocked {blocked}",
        )
    running = _sum(loads, "num_running_reqs")
    transfers = sum(_sum(loads, path) for path in _TRANSFER_QUEUES[role])
    queued = _sum(loads, "queues.waiting")
    if running == 0 and queued == 0 and transfers > 0:
        return False, (
            f"nothing runs, yet {transfers} request(s) wait in its KV bootstrap/transfer queues: the KV "
            "transfer is stuck (the frontend's --kv-transfer-timeout-s ends such requests)"
        )
    if running or queued or transfers:
        return True, f"it is busy ({running} running, {queued} queued for compute, {transfers} in KV handoff)"
    return False, "it answers load queries and runs nothing, yet the canary got no answer"


async def embedding_canary(engine: Any, timeout_s: float) -> str | None:
    """An embedding worker's canary: embed one token; None when SGLang answered within ``timeout_s``."""
    request = GenerateRequest(
        request_id=f"canary-{uuid.uuid4().hex}",
        model="canary",
        token_ids=[0],
        stop=StopConditions(max_tokens=1),
        embed=EmbedOptions(inputs=[[0]]),
    )
    try:
        async with asyncio.timeout(timeout_s):
            stream = handler.stream_embedding(engine, request, request.request_id, embedding_input)
            async with contextlib.aclosing(stream) as chunks:
                async for chunk in chunks:
                    return (
                        None if chunk.error is None else f"SGLang refused the canary: {chunk.error.message}"
                    )
        return "SGLang ended the embedding canary without an answer"
    except TimeoutError:
        return f"SGLang did not answer an embedding canary within {timeout_s:.0f}s"
