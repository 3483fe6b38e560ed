"""Tier-aware KV routing end to end: two mocker workers with a small GPU cache and a HiCache host tier
(``--enable-hierarchical-cache``) publish real KV events on a real nats-server. A conversation's first
turn lands on one worker; other traffic then evicts it from that worker's GPU into its host memory (a
demotion the router sees from the events). The conversation returns while the holder is busy with
another request: the tier-aware frontend (default weights) sends it to the holder, where it is a host
hit (``cached_tokens`` covers its history, loaded back from host memory); a GPU-only frontend
(``--kv-host-hit-weight 0``) sees no holder and sends it to the idle worker, where it is computed
afresh. The cached share and the workers' ``dynamo_worker_cached_tokens{tier="host"}`` tell them apart."""

from __future__ import annotations

import re

import openai
import pytest
from dynamo_worker.protocol import hash_token_blocks
from dynamo_worker.router.index import TierOverlap

from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

MODEL = "tiny"
PAGE = 4
HISTORY = 96  # 24 blocks
FLOOD = 160  # 40 blocks per request of other traffic; the GPU holds 128 blocks
WORKER_FLAGS = ("--num-kv-blocks", "128", "--enable-hierarchical-cache", "--hicache-ratio", "8")


def ids(start: int, n: int) -> list[int]:
    return [100 + (start + i) % 700 for i in range(n)]


def holders(fe, prompt: list[int]) -> dict:
    hashes = hash_token_blocks(prompt, PAGE)
    return {t[0]: o for t, o in fe.router.index.tier_overlaps(hashes, fe.router.index.targets()).items()}


def host_cached(mocker) -> float:
    found = re.search(r'^dynamo_worker_cached_tokens_total\{tier="host"\} (\S+)$', mocker.metrics(), re.M)
    return float(found[1]) if found else 0.0


async def indexed(fe, prompt: list[int]) -> str:
    """The worker the router sees holding ``prompt`` on its GPU, once that request's events arrived."""
    full = len(prompt) // PAGE
    await wait_until_async(
        lambda: any(o.gpu == full for o in holders(fe, prompt).values()),
        "a request's KV events",
        timeout_s=10,
    )
    return next(w for w, o in holders(fe, prompt).items() if o.gpu == full)


async def returning_conversation(fe, client, seed: int) -> int:
    """A conversation's first turn, other traffic until the router sees its history demoted to host
    memory, then its return while the holder runs a request: the return's cached tokens."""
    history = ids(seed, HISTORY)
    await client.completions.create(model=MODEL, prompt=history, max_tokens=2)
    holder = await indexed(fe, history)
    busy = None
    for n in range(40):
        if holders(fe, history)[holder] == TierOverlap(host=HISTORY // PAGE):
            break
        prompt = ids(seed + 1000 + n * FLOOD, FLOOD)
        await client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
        busy = prompt if await indexed(fe, prompt) == holder else busy
    else:
        raise AssertionError(f"other traffic did not demote the history: {holders(fe, history)}")
    assert busy is not None and holders(fe, busy)[holder].gpu == FLOOD // PAGE
    # a request the holder has on its GPU (both policies send it there), running while the conversation
    # returns
    stream = await client.completions.create(model=MODEL, prompt=[*busy, 1], max_tokens=400, stream=True)
    try:
        await anext(aiter(stream))  # it runs: the frontend counts it on the holder
        returning = await client.completions.create(model=MODEL, prompt=[*history, 7, 8, 9], max_tokens=2)
    finally:
        await stream.close()
    details = returning.usage.prompt_tokens_details
    return details.cached_tokens if details else 0


async def test_tier_aware_routing_follows_a_conversation_into_host_memory(
    mockers, frontend_factory, wait_workers, namespace
):
    results = {}
    for name, weights in (
        ("tiered", {}),
        ("gpu-only", {"kv_host_hit_weight": 0.0, "kv_disk_hit_weight": 0.0}),
    ):
        ns = f"{namespace}-{name}"  # fresh workers for each policy
        ms = [mockers("null", *WORKER_FLAGS, "--namespace", ns, speedup=1.0) for _ in range(2)]
        fe = await frontend_factory(router_mode="kv", namespace=ns, **weights)
        await wait_workers(fe, 2, mockers=ms)
        async with openai.AsyncOpenAI(
            base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=30
        ) as client:
            cached = await returning_conversation(fe, client, seed=0)
        results[name] = (cached, sum(host_cached(m) for m in ms))
    print(f"returning conversation: (cached tokens, host-loaded tokens on the workers) {results}")
    tiered_cached, tiered_host = results["tiered"]
    gpu_cached, gpu_host = results["gpu-only"]
    assert tiered_cached >= HISTORY - PAGE and tiered_host >= HISTORY - PAGE, "a host hit on the holder"
    assert gpu_cached == 0 and gpu_host == 0, "GPU-only routing sent it to the idle worker"
