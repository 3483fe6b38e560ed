"""KV routing state that survives restarts, against real mocker workers, a real nats-server and the
official openai client: a frontend started after the workers filled their caches loads their blocks
(a snapshot request on the event plane) and routes repeats onto them, converging with the frontend
that saw every event; a worker that restarts under the same instance id loses its blocks in the
index; a data-parallel worker is routed per dp rank by that rank's cache."""

from __future__ import annotations

import openai
import pytest
from dynamo_worker.frontend.models.preprocessor import Preprocessor
from dynamo_worker.protocol import hash_token_blocks

from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

MODEL = "tiny"
PAGE = 4


def prefix(tag: str, n: int) -> str:
    return f"{tag} system prompt {n}: " + " ".join(f"w{tag}{n}x{i}" for i in range(40))


async def complete(fe, prompt: str) -> int:
    """Send one completion; the prompt tokens the worker found cached."""
    async with openai.AsyncOpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=30) as c:
        r = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    details = r.usage.prompt_tokens_details
    return details.cached_tokens if details else 0


def held(fe, pre: Preprocessor, prompt: str) -> dict:
    """Per cache (worker, dp rank), how many of the prompt's blocks this frontend's index holds."""
    hashes = hash_token_blocks(pre.encode_prompt(prompt), PAGE)
    return {t: n for t, n in fe.router.index.overlaps(hashes, fe.router.index.targets()).items() if n}


def full(fe, pre: Preprocessor, prompt: str, blocks: int) -> list:
    """The caches that hold all ``blocks`` blocks of the prompt."""
    return [t for t, n in held(fe, pre, prompt).items() if n == blocks]


async def test_a_frontend_started_after_the_workers_routes_on_their_existing_cache(
    mockers, frontend_factory, wait_workers, tiny_model
):
    ms = [mockers("null", speedup=100.0) for _ in range(3)]
    first = await frontend_factory(router_mode="kv")
    await wait_workers(first, 3, mockers=ms)
    pre = Preprocessor.from_dir(tiny_model)
    prompts = [prefix("late", p) for p in range(4)]
    for prompt in prompts:
        await complete(first, prompt)
    await wait_until_async(
        lambda: all(held(first, pre, p) for p in prompts),
        "the first frontend to index the prompts",
        timeout_s=10.0,
        interval_s=0.02,
    )
    ids = first.router.index.workers()
    assert sum(first.router.index.block_count(w) for w in ids) > 0

    def view(fe) -> dict:
        return {w: fe.router.index.block_count(w) for w in ids}

    late = await frontend_factory(router_mode="kv")
    await wait_workers(late, 3, mockers=ms)
    # No request was sent since, so what the late frontend knows came from the workers' snapshots.
    # Compared with the first frontend's view as it is now: a block completed by a request's last
    # decoded tokens may be published just after its response, so a copy taken earlier can be stale.
    await wait_until_async(
        lambda: view(late) == view(first),
        "the late frontend to converge to the first one's view",
        timeout_s=10.0,
        interval_s=0.02,
    )
    assert late.kv_feed is not None and late.kv_feed.snapshots_loaded == 3
    for prompt in prompts:
        holder = held(first, pre, prompt)
        assert held(late, pre, prompt) == holder
        prompt_blocks = len(pre.encode_prompt(prompt)) // PAGE
        assert await complete(late, prompt + " and once more?") >= (prompt_blocks - 1) * PAGE


async def test_a_worker_restart_clears_its_blocks(mockers, frontend_factory, wait_workers, tiny_model):
    """A crashed worker restarted under the same instance id (as a pod keeps its name) has an empty
    cache: the frontend drops the blocks it held as soon as the new process publishes, so the router
    no longer believes the old prefix is cached there."""
    instance = "00c0ffee00c0ffee"
    old = mockers("null", "--instance-id", instance, speedup=100.0)
    fe = await frontend_factory(router_mode="kv")
    await wait_workers(fe, 1, mockers=[old])
    pre = Preprocessor.from_dir(tiny_model)
    before = prefix("restart", 0)
    await complete(fe, before)
    await wait_until_async(
        lambda: held(fe, pre, before), "the prompt to be indexed", timeout_s=10.0, interval_s=0.02
    )
    old_address = fe.registry.get(MODEL).workers[instance].address
    old.kill()

    new = mockers("null", "--instance-id", instance, speedup=100.0)
    await wait_until_async(
        lambda: (w := fe.registry.get(MODEL).workers.get(instance)) is not None and w.address != old_address,
        "the restarted worker to register its new address",
        timeout_s=30.0,
        interval_s=0.02,
    )
    assert new.proc.poll() is None
    await complete(fe, prefix("fresh", 1))  # the new process's first KV events (seq 0)
    await wait_until_async(
        lambda: not held(fe, pre, before), "the old blocks to be dropped", timeout_s=10.0, interval_s=0.02
    )
    assert await complete(fe, before) == 0  # and indeed nothing of it was cached


async def test_dp_ranks_are_routed_by_their_own_cache(mockers, frontend_factory, wait_workers, tiny_model):
    """A mocker with two dp ranks (a KV cache each, events tagged with the rank) alternates ranks for
    requests that name none, so a repeat would miss half the time; the kv router sends each repeat
    to the rank that holds its prefix (``data_parallel_rank``), and it is served from cache."""
    m = mockers("null", "--dp-size", "2", speedup=100.0)
    fe = await frontend_factory(router_mode="kv")
    await wait_workers(fe, 1, mockers=[m])
    pre = Preprocessor.from_dir(tiny_model)
    for p in range(4):
        prompt = prefix("dp", p)
        await complete(fe, prompt + " one?")
        prompt_blocks = len(pre.encode_prompt(prompt)) // PAGE
        await wait_until_async(
            lambda p=prompt, n=prompt_blocks: full(fe, pre, p, n),
            "the prompt to be indexed",
            timeout_s=10.0,
            interval_s=0.02,
        )
        (rank_key,) = full(fe, pre, prompt, prompt_blocks)
        assert await complete(fe, prompt + " two?") >= (prompt_blocks - 1) * PAGE, f"prefix {p} on {rank_key}"
