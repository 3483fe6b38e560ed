"""Load from the engines steers requests: two real mocker workers, two frontends on a real nats-server.
Frontend A loads worker 1 while it is the only worker: three long prompts, of which its KV cache holds
one, so two wait there with their prefill tokens. Frontend B, which sent nothing there, sees that load
only through worker 1's load reports (queued prefill tokens, in blocks) and sends its three short
requests to worker 2. Counting a waiting request as one block (as before), or B's own in-flight
requests alone, B would send one of them to worker 1, behind A's long prefills."""

from __future__ import annotations

import asyncio
import re

import openai
import pytest

from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

MODEL = "tiny"
# A KV cache for one of A's long requests at once (the others wait in the worker's queue), slow decode
# steps so that A's requests stay there for the whole test
SLOW = ("--num-kv-blocks", "200", "--decode-base-ms", "200")


def served(metrics: str) -> float:
    found = re.findall(r'^dynamo_worker_requests_total\{outcome="(?:length|stop)"\} (\S+)$', metrics, re.M)
    return sum(float(n) for n in found)


def inflight(metrics: str) -> float:
    found = re.search(r"^dynamo_worker_inflight_requests (\S+)$", metrics, re.M)
    return float(found.group(1)) if found else 0.0


def prompt(tag: str, i: int, words: int) -> str:
    return f"{tag} {i}: " + " ".join(f"w{tag}{i}x{k}" for k in range(words))


async def test_a_frontend_routes_around_load_it_only_knows_from_the_workers_reports(
    mockers, frontend_factory, wait_workers
):
    w1 = mockers("null", *SLOW, speedup=1.0)
    a = await frontend_factory(router_mode="kv")
    await wait_workers(a, 1, mockers=[w1])
    async with openai.AsyncOpenAI(base_url=a.url + "/v1", api_key="x", max_retries=0, timeout=120) as ca:
        load = [
            asyncio.create_task(
                ca.completions.create(
                    model=MODEL, prompt=prompt("a", i, 120), max_tokens=50, extra_body={"ignore_eos": True}
                )
            )
            for i in range(3)
        ]
        await wait_until_async(
            lambda: inflight(w1.metrics()) == 3, "A's 3 requests on worker 1", timeout_s=20, interval_s=0.05
        )
        w2 = mockers("null", *SLOW, speedup=1.0)
        b = await frontend_factory(router_mode="kv")
        await wait_workers(b, 2, mockers=[w1, w2])
        w1_id = w1.instance_id
        # B learns worker 1's queue from its reports alone (2 waiting, about 300 blocks of prefill)
        await wait_until_async(
            lambda: b.router.load_of(w1_id)["others_prefill"] >= 250,
            "frontend B to see worker 1's queued prefill in its load reports",
            timeout_s=20,
            interval_s=0.05,
            explain=lambda: f"B's view of worker 1: {b.router.load_of(w1_id)}",
        )
        async with openai.AsyncOpenAI(base_url=b.url + "/v1", api_key="x", max_retries=0, timeout=60) as cb:
            answers = await asyncio.gather(
                *(
                    cb.completions.create(
                        model=MODEL, prompt=prompt("b", i, 10), max_tokens=5, extra_body={"ignore_eos": True}
                    )
                    for i in range(3)
                )
            )
        assert all(r.choices[0].finish_reason == "length" for r in answers)
        # worker 2 served all of B's requests (each counts as it ends)
        await wait_until_async(
            lambda: served(w2.metrics()) == 3,
            "worker 2 to serve B's 3 requests",
            timeout_s=20,
            interval_s=0.05,
            explain=lambda: f"worker 2 served {served(w2.metrics())}, worker 1 {served(w1.metrics())}",
        )
        for t in load:
            t.cancel()
        await asyncio.gather(*load, return_exceptions=True)
