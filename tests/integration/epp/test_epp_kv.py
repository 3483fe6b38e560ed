"""KV-aware routing through a real Envoy and the endpoint picker: on a shared-prefix workload it finds the
cached share the frontend's own kv router finds, and with two frontend replicas behind Envoy a
conversation's turns stay on one worker (one decision for all replicas)."""

from __future__ import annotations

import random

import openai
import pytest
from dynamo_worker.frontend.models.preprocessor import Preprocessor
from dynamo_worker.protocol import hash_token_blocks

from tests.integration.epp.support import picks, scrape
from tests.integration.frontend.conftest import MODEL
from tests.support.metrics import metric
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

PAGE = 4  # the mockers' page size (frontend conftest)


def workload(tag: str, prefixes: int = 6, repeats: int = 3) -> list[str]:
    words = ["alpha", "beta", "gamma", "delta", "robot", "paint", "story", "cache", "block", "prefix"]
    rng = random.Random(tag)
    prompts = []
    for p in range(prefixes):
        prefix = f"{tag} system prompt {p}: " + " ".join(rng.choice(words) for _ in range(100))
        prompts += [f"{prefix} question {q}?" for q in range(repeats)]
    rng.shuffle(prompts)
    return prompts


async def indexed(router, ids: list[int]) -> None:
    """Until ``router`` has the KV events of a request of prompt ``ids`` (the next decision sees them)."""
    hashes = hash_token_blocks(ids, PAGE)
    await wait_until_async(
        lambda: max(router.index.overlaps(hashes, router.index.targets()).values(), default=0) >= len(hashes),
        "the request's KV events to reach the router",
        timeout_s=10,
        interval_s=0.01,
    )


async def cached_share(url: str, prompts: list[str], router, pre: Preprocessor) -> float:
    cached = total = 0
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30) as c:
        for prompt in prompts:
            r = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
            details = r.usage.prompt_tokens_details
            cached += details.cached_tokens if details else 0
            total += r.usage.prompt_tokens
            await indexed(router, pre.encode_prompt(prompt))
    return cached / total


async def test_shared_prefix_workload_through_envoy_caches_as_much_as_the_frontends_own_kv_router(
    mockers, frontend_factory, wait_workers, epp_factory, envoy, tiny_model
):
    """The same three workers serve both runs, each with prefixes of its own (a fresh cache)."""
    pre = Preprocessor.from_dir(tiny_model)
    ms = [mockers("null", speedup=100.0) for _ in range(3)]
    kv = await frontend_factory(router_mode="kv")
    fe = await frontend_factory(router_mode="direct")
    epp = await epp_factory([fe], router_mode="kv")
    for stack in (kv, fe, epp):
        await wait_workers(stack, 3, mockers=ms)
    share_own = await cached_share(kv.url, workload("own"), kv.router, pre)
    gateway = envoy(epp.grpc_port)
    share_epp = await cached_share(gateway.url, workload("behind"), epp.router, pre)
    assert share_own > 0.5, share_own  # the workload repeats each prefix: a kv router finds most of it
    assert abs(share_epp - share_own) <= 0.02, (share_epp, share_own)


async def test_two_frontend_replicas_behind_envoy_keep_a_conversations_turns_on_one_worker(
    mockers, frontend_factory, wait_workers, epp_factory, envoy, tiny_model
):
    ms = [mockers("null", speedup=100.0) for _ in range(3)]
    replicas = [await frontend_factory(router_mode="direct") for _ in range(2)]
    epp = await epp_factory(replicas, router_mode="kv")
    for fe in (*replicas, epp):
        await wait_workers(fe, 3, mockers=ms)
    gateway = envoy(epp.grpc_port)
    pre = Preprocessor.from_dir(tiny_model)
    messages = [{"role": "system", "content": "You are a careful assistant. " * 20}]
    async with openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=30) as c:
        for turn in range(6):
            messages.append({"role": "user", "content": f"Question {turn}: tell me more about turn {turn}."})
            r = await c.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
            messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
            ids = pre.encode_chat(messages[:-1], True, {})
            await indexed(epp.router, ids)
    counts = {m.instance_id: await picks(epp, m.instance_id) for m in ms}
    assert sorted(counts.values()) == [0, 0, 6], counts
    carried = [
        metric(
            await scrape(fe.port),
            "dynamo_frontend_requests_total",
            f'endpoint="chat",model="{MODEL}",status="200"',
        )
        for fe in replicas
    ]
    assert carried == [3, 3], carried  # the picker spread the turns over both replicas
