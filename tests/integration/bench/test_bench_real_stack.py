"""The load generator against the real stack: a mocker worker process and a frontend process on a real
nats-server. Both targets (OpenAI SSE through the frontend, straight to the request plane) stream
exact output lengths (ignore_eos is honoured), report prompt tokens, and see cache hits on a repeated
prompt; the shared-prefix workload's turns all complete."""

from __future__ import annotations

import random

import pytest
from dynamo_worker.bench.client import OpenAITarget, RequestPlaneTarget, make_session
from dynamo_worker.bench.runner import IteratorWorkload, SharedPrefixWorkload, run_load
from dynamo_worker.bench.stats import summarize
from dynamo_worker.bench.workload import LengthDist, RequestSpec, random_requests, shared_prefix_turns

from tests.bench.fleet import MODEL, Fleet

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with Fleet(tmp_path_factory.mktemp("bench-fleet")) as fleet:
        mocker = fleet.mocker("bench-it", speedup=100)
        frontend = fleet.frontend("bench-it")
        fleet.wait_workers(frontend, {"agg": 1})
        yield fleet, mocker, frontend


def _spec_list(seed: int, n: int) -> list[RequestSpec]:
    specs = random_requests(
        random.Random(seed), LengthDist.parse("fixed:40"), LengthDist.parse("uniform:3,12")
    )
    return [next(specs) for _ in range(n)]


def _specs(seed: int) -> IteratorWorkload:
    return IteratorWorkload(
        random_requests(random.Random(seed), LengthDist.parse("fixed:40"), LengthDist.parse("uniform:3,12"))
    )


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_openai_target_through_the_frontend(stack, api):
    _, _, frontend = stack
    async with make_session() as session:
        target = OpenAITarget(session, f"http://127.0.0.1:{frontend.ports['http']}", MODEL, api=api)
        results = await run_load(target, _specs(1), concurrency=4, num_requests=12, duration_s=60)
        repeat = RequestSpec(0, ({"role": "user", "content": "the same words " * 30},), 4, 90)
        first, second = await target.send(repeat), await target.send(repeat)
    assert all(r.ok for r in results), [r.error_message for r in results if not r.ok]
    specs = _spec_list(1, 12)
    assert sorted(r.output_tokens for r in results) == sorted(s.max_tokens for s in specs)
    assert all(r.prompt_tokens and r.first_chunk is not None for r in results)
    assert first.ok and second.ok and second.cached_tokens > 0
    assert summarize(results).cache_hit_rate is not None


async def test_request_plane_target_straight_to_the_mocker(stack):
    fleet, mocker, _ = stack
    target = RequestPlaneTarget(
        f"127.0.0.1:{mocker.ports['request']}", MODEL, fleet.model_dir / "tokenizer.json"
    )
    try:
        results = await run_load(target, _specs(2), concurrency=4, num_requests=8, duration_s=60)
    finally:
        await target.close()
    assert all(r.ok for r in results), [r.error_message for r in results if not r.ok]
    assert all(
        r.output_tokens == len(r.chunk_times) or r.output_tokens >= len(r.chunk_times) for r in results
    )
    assert all(r.output_tokens >= 3 and r.prompt_tokens for r in results)


async def test_shared_prefix_conversations_through_the_frontend(stack):
    _, _, frontend = stack
    plan = shared_prefix_turns(
        random.Random(3),
        num_prefixes=2,
        users_per_prefix=2,
        turns=2,
        prefix_words=60,
        input_len=LengthDist.parse("fixed:8"),
        output_len=LengthDist.parse("fixed:6"),
    )
    async with make_session() as session:
        target = OpenAITarget(session, f"http://127.0.0.1:{frontend.ports['http']}", MODEL)
        results = await run_load(target, SharedPrefixWorkload(plan), concurrency=3, num_requests=100)
    report = summarize(results)
    assert report.completed == 8 and not report.errors
    assert report.cache_hit_rate and report.cache_hit_rate > 0
