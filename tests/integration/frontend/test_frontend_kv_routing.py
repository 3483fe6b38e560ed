"""KV-aware routing end to end: three mocker workers emit real KV events; with ``--router-mode kv``
every request that shares a long prefix with an earlier one lands on the worker holding that prefix
(its cached tokens cover the prefix), and the cache hit rate is far above round-robin's on the same
shuffled workload (fresh prefixes for each policy)."""

from __future__ import annotations

import random

import openai
import pytest
from dynamo_worker.frontend.models.preprocessor import Preprocessor
from dynamo_worker.protocol import hash_token_blocks

from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

MODEL = "tiny"
PAGE = 4
PREFIXES = 9
REPEATS = 3


def workload(tag: str) -> list[str]:
    words = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "omega",
        "robot",
        "paint",
        "story",
        "cache",
        "block",
        "prefix",
        "decode",
    ]
    rng = random.Random(tag)
    prompts = []
    for p in range(PREFIXES):
        prefix = f"{tag} system prompt {p}: " + " ".join(rng.choice(words) for _ in range(120))
        prompts += [f"{prefix} question {q}?" for q in range(REPEATS)]
    rng.shuffle(prompts)
    return prompts


async def run(fe, prompts: list[str], pre: Preprocessor, wait_indexed: bool) -> tuple[float, list[int]]:
    cached, total, per_request = 0, 0, []
    async with openai.AsyncOpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=30) as c:
        for prompt in prompts:
            r = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
            details = r.usage.prompt_tokens_details
            got = details.cached_tokens if details else 0
            cached += got
            total += r.usage.prompt_tokens
            per_request.append(got)
            if wait_indexed:  # let the KV events of this request reach the router before the next one
                hashes = hash_token_blocks(pre.encode_prompt(prompt), PAGE)
                await wait_until_async(
                    lambda h=hashes: (
                        max(fe.router.index.overlaps(h, fe.router.index.targets()).values()) >= len(h)
                    ),
                    "the request's KV events to reach the router",
                    timeout_s=10,
                    interval_s=0.01,
                )
    return cached / total, per_request


async def test_kv_routing_follows_prefix_and_beats_round_robin(
    mockers, frontend_factory, wait_workers, tiny_model
):
    ms = [mockers("null", speedup=100.0) for _ in range(3)]
    kv = await frontend_factory(router_mode="kv")
    rr = await frontend_factory(router_mode="round-robin")
    await wait_workers(kv, 3, mockers=ms)
    await wait_workers(rr, 3, mockers=ms)
    pre = Preprocessor.from_dir(tiny_model)

    kv_prompts = workload("kv")
    kv_rate, kv_cached = await run(kv, kv_prompts, pre, wait_indexed=True)
    rr_rate, _ = await run(rr, workload("rr"), pre, wait_indexed=False)

    seen: set[str] = set()
    for prompt, cached in zip(kv_prompts, kv_cached, strict=True):
        prefix = prompt.rsplit(" question ", 1)[0]
        prefix_tokens = len(pre.encode_prompt(prefix))
        if prefix in seen:
            assert cached >= prefix_tokens - 2 * PAGE, (
                f"request did not land on the prefix holder: {prompt[:40]}"
            )
        seen.add(prefix)
    print(f"kv hit rate {kv_rate:.2f} vs round-robin {rr_rate:.2f}")
    assert kv_rate > 0.55
    assert kv_rate > 1.5 * rr_rate
