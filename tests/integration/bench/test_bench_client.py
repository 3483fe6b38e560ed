"""The load generator over real HTTP: SSE streaming of chat and text completions, TTFT/ITL from chunk
arrival, usage and cached tokens, errors by type, closed and open loop with their caps, and the
shared-prefix workload's growing conversations. The server is a small aiohttp OpenAI-compatible stub
started in the test (the real frontend needs NATS and workers; its own tests cover it)."""

from __future__ import annotations

import asyncio
import itertools
import random

import orjson
import pytest
from aiohttp import web
from dynamo_worker.bench import BenchSettings, build_workload, run_bench
from dynamo_worker.bench.client import OpenAITarget, make_session
from dynamo_worker.bench.runner import IteratorWorkload, SharedPrefixWorkload, run_load
from dynamo_worker.bench.stats import summarize
from dynamo_worker.bench.workload import LengthDist, random_requests, shared_prefix_turns

from tests.support.ports import refused_port

pytestmark = pytest.mark.integration


class Stub:
    """Streams ``max_tokens`` chunks of one word each; ``fail`` picks a failure for a request."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.fail: str | None = None
        self.delay = 0.0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.fail == "503":
            return web.json_response({"error": {"message": "no workers", "type": "unavailable"}}, status=503)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chat = request.path.endswith("/chat/completions")
        for i in range(body["max_tokens"]):
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.fail == "midstream" and i == 1:
                await resp.write(b'data: {"error": {"message": "worker died", "type": "internal"}}\n\n')
                return resp
            choice = {"index": 0, "delta": {"content": f"w{i} "}} if chat else {"index": 0, "text": f"w{i} "}
            await resp.write(b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\n")
        if self.fail == "truncate":
            return resp
        prompt_tokens = sum(len(m["content"].split()) for m in body.get("messages", [])) or len(
            body.get("prompt", "").split()
        )
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": body["max_tokens"],
            "prompt_tokens_details": {"cached_tokens": prompt_tokens // 2},
        }
        if "nvext" in body:  # as NVIDIA Dynamo's frontend: no cached tokens, the router's hit rate instead
            del usage["prompt_tokens_details"]
            timing = {"nvext": {"timing": {"kv_hit_rate": 0.25}}}
            await resp.write(b"data: " + orjson.dumps({"choices": [], **timing}) + b"\n\n")
        await resp.write(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture
async def stub():
    s = Stub()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", s.handle)
    app.router.add_post("/v1/completions", s.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    s.url = f"http://127.0.0.1:{port}"
    yield s
    await runner.cleanup()


def _specs(seed=0, words="fixed:8", out="fixed:4"):
    return IteratorWorkload(
        random_requests(random.Random(seed), LengthDist.parse(words), LengthDist.parse(out))
    )


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_closed_loop_streams_counts_tokens_and_times_chunks(stub, api):
    async with make_session() as session:
        target = OpenAITarget(session, stub.url + "/v1", "m", api=api, api_key="k")
        results = await run_load(target, _specs(), concurrency=3, num_requests=7)
    assert len(results) == 7 and all(r.ok for r in results)
    assert all(r.output_tokens == 4 and len(r.chunk_times) == 4 for r in results)
    assert all(r.start < r.first_chunk <= r.chunk_times[-1] <= r.end for r in results)
    assert all(r.prompt_tokens == 8 and r.cached_tokens == 4 for r in results)
    assert results[0].text == "w0 w1 w2 w3 "
    body = stub.bodies[0]
    assert body["stream"] is True and body["max_tokens"] == 4 and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert ("messages" in body) == (api == "chat") and ("prompt" in body) == (api == "completions")
    report = summarize(results)
    assert report.cache_hit_rate == pytest.approx(0.5)
    assert report.itl_ms.count == 7 * 3


async def test_extra_body_is_sent_and_dynamos_kv_hit_rate_counts_as_cached(stub):
    extra = {"nvext": {"extra_fields": ["timing"]}}
    async with make_session() as session:
        target = OpenAITarget(session, stub.url, "m", api="completions", extra_body=extra)
        results = await run_load(target, _specs(words="fixed:8"), concurrency=1, num_requests=2)
    assert stub.bodies[0]["nvext"] == extra["nvext"] and stub.bodies[0]["max_tokens"] == 4
    assert [(r.prompt_tokens, r.cached_tokens) for r in results] == [(8, 2), (8, 2)]


@pytest.mark.parametrize(
    ("fail", "error"), [("503", "http_503"), ("midstream", "stream_error"), ("truncate", "incomplete")]
)
async def test_failures_are_counted_by_type(stub, fail, error):
    stub.fail = fail
    async with make_session() as session:
        results = await run_load(
            OpenAITarget(session, stub.url, "m"), _specs(), concurrency=2, num_requests=4
        )
    report = summarize(results)
    assert report.completed == 0 and report.errors == {error: 4}
    if fail == "503":
        assert results[0].error_message == "no workers"


async def test_unreachable_server_is_a_connect_error():
    async with make_session() as session:
        target = OpenAITarget(session, f"http://127.0.0.1:{refused_port()}", "m")
        results = await run_load(target, _specs(), concurrency=1, num_requests=2)
    assert [r.error for r in results] == ["connect", "connect"]


async def test_slow_requests_past_the_drain_bound_are_cancelled_and_reported(stub):
    stub.delay = 1.0
    async with make_session() as session:
        target = OpenAITarget(session, stub.url, "m")
        results = await run_load(
            target, _specs(out="fixed:30"), concurrency=2, num_requests=2, duration_s=0.1, drain_s=0.2
        )
    assert [r.error for r in results] == ["cancelled", "cancelled"]


async def test_open_loop_sends_at_poisson_times_until_the_request_cap(stub):
    async with make_session() as session:
        target = OpenAITarget(session, stub.url, "m")
        results = await run_load(target, _specs(), mode="open", rate=200.0, num_requests=20, seed=1)
    assert len(results) == 20 and all(r.ok for r in results)


async def test_open_loop_stops_sending_at_the_duration_cap(stub):
    async with make_session() as session:
        target = OpenAITarget(session, stub.url, "m")
        results = await run_load(
            target, _specs(), mode="open", rate=20.0, num_requests=10_000, duration_s=0.3, seed=1
        )
    assert 0 < len(results) < 100


async def test_shared_prefix_turns_carry_the_conversation_and_its_answers(stub):
    plan = shared_prefix_turns(
        random.Random(0),
        num_prefixes=2,
        users_per_prefix=2,
        turns=3,
        prefix_words=20,
        input_len=LengthDist.parse("fixed:3"),
        output_len=LengthDist.parse("fixed:2"),
    )
    async with make_session() as session:
        results = await run_load(
            OpenAITarget(session, stub.url, "m"), SharedPrefixWorkload(plan), concurrency=4, num_requests=100
        )
    assert len(results) == 12 and all(r.ok for r in results)
    by_user: dict[str, list[list[dict]]] = {}
    for body in stub.bodies:
        msgs = body["messages"]
        assert msgs[0]["role"] == "system" and msgs[0]["content"] in plan.system_prompts
        by_user.setdefault(msgs[1]["content"], []).append(msgs)
    assert len(by_user) == 4
    for turns in by_user.values():
        turns.sort(key=len)
        assert [len(m) for m in turns] == [2, 4, 6]
        for earlier, later in itertools.pairwise(turns):
            assert later[: len(earlier)] == earlier
            assert later[len(earlier)] == {"role": "assistant", "content": "w0 w1 "}


async def test_run_bench_from_settings_warms_up_and_reports(stub):
    settings = BenchSettings.parse(
        [
            "--url",
            stub.url,
            "--model",
            "m",
            "--num-requests",
            "5",
            "--warmup",
            "2",
            "--concurrency",
            "2",
            "--workload",
            "shared-prefix",
            "--num-prefixes",
            "1",
            "--users-per-prefix",
            "2",
            "--turns",
            "2",
        ],
        env={},
    )
    assert isinstance(build_workload(settings), SharedPrefixWorkload)
    report = await run_bench(settings)
    assert report.completed == 4  # the plan has 1 x 2 x 2 turns, under the cap of 5
    assert len(stub.bodies) == 2 + 4


def test_settings_reject_a_bad_length_distribution_naming_the_flag():
    from dynamo_worker.runtime.settings import SettingsError

    with pytest.raises(SettingsError, match="--input-len"):
        BenchSettings.parse(["--model", "m", "--input-len", "fixed:0"], env={})
