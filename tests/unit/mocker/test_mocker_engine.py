"""The mocker engine in-process (no network): continuous batching, token and stop semantics, usage with
prefix-cache hits, KV events, preemption when the cache is full, and cancellation freeing blocks."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Sequence

import pytest
from dynamo_worker.mocker.engine import MockerEngine
from dynamo_worker.mocker.settings import MockerSettings
from dynamo_worker.mocker.timing import TimingModel
from dynamo_worker.protocol import BlockStored, GenerateChunk, GenerateRequest, KvEvent, StopConditions
from dynamo_worker.runtime.engine import LoadSnapshot
from dynamo_worker.tinymodel import ensure_tiny_model


class Recorder:
    def __init__(self) -> None:
        self.events: list[KvEvent] = []
        self.ranks: list[int] = []  # the dp rank of each event
        self.loads: list[LoadSnapshot] = []

    def kv_events(self, events: Sequence[KvEvent], dp_rank: int = 0) -> None:
        self.events.extend(events)
        self.ranks.extend(dp_rank for _ in events)

    def load(self, snapshot: LoadSnapshot) -> None:
        self.loads.append(snapshot)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return ensure_tiny_model(tmp_path_factory.mktemp("tiny") / "m")


@pytest.fixture
async def make_engine(model_dir):
    engines: list[MockerEngine] = []

    async def make(**kw) -> tuple[MockerEngine, Recorder]:
        settings = MockerSettings(**{"model_dir": model_dir, "speedup": 1000, "page_size": 4, **kw})
        engine, rec = MockerEngine(settings), Recorder()
        engine.attach_events(rec)
        await engine.start()
        engines.append(engine)
        return engine, rec

    yield make
    for e in engines:
        await e.stop()


def req(rid: str, tokens: list[int], max_tokens: int = 8, **stop) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid, model="m", token_ids=tokens, stop=StopConditions(max_tokens=max_tokens, **stop)
    )


async def collect(engine: MockerEngine, request: GenerateRequest) -> list[GenerateChunk]:
    async with asyncio.timeout(20):
        return [c async for c in engine.generate(request)]


def tokens_of(chunks: list[GenerateChunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


async def test_streams_max_tokens_deterministically(make_engine):
    engine, _ = await make_engine()
    a = await collect(engine, req("a", list(range(10, 30)), 8))
    b = await collect(engine, req("b", list(range(10, 30)), 8))
    assert len(tokens_of(a)) == 8 and all(len(c.token_ids) <= 1 for c in a)
    assert a[-1].finish_reason == "length" and a[-1].usage is not None
    assert a[-1].usage.prompt_tokens == 20 and a[-1].usage.completion_tokens == 8
    assert tokens_of(a) == tokens_of(b)
    assert all(c.finish_reason is None for c in a[:-1])


async def test_a_continuation_from_the_tokens_emitted_is_the_rest_of_the_stream(make_engine):
    """Like a greedy model: prompt + the first 8 tokens gives tokens 9..20 of the whole answer (what
    makes a migrated stream checkable token for token)."""
    engine, _ = await make_engine()
    prompt = list(range(10, 30))
    whole = tokens_of(await collect(engine, req("a", prompt, 20)))
    rest = tokens_of(await collect(engine, req("b", [*prompt, *whole[:8]], 12)))
    assert rest == whole[8:]


async def test_stream_interval_hands_tokens_over_in_batches_as_sglang_does(make_engine):
    """SGLang's rule for a streamed request with ``stream_interval`` k: the first token at once, then
    each k more, the rest with the final chunk; the tokens are those of a request without it."""
    engine, _ = await make_engine()
    prompt = list(range(10, 30))
    each = await collect(engine, req("a", prompt, 10))
    batched = await collect(engine, req("b", prompt, 10).model_copy(update={"stream_interval": 4}))
    assert [len(c.token_ids) for c in batched] == [1, 4, 4, 1]
    assert tokens_of(batched) == tokens_of(each) and batched[-1].finish_reason == "length"


async def test_engine_restarts_empty_after_stop(make_engine):
    engine, _ = await make_engine()
    await collect(engine, req("a", list(range(100, 140)), 2))
    assert engine.kv.cached_prefix_tokens(list(range(100, 140))) > 0  # cached before the restart
    await engine.stop()
    await engine.start()
    again = await collect(engine, req("b", list(range(100, 140)), 2))
    assert again[-1].usage is not None and again[-1].usage.cached_tokens == 0  # its cache is new


async def test_shared_prefix_is_reported_as_cached_and_stored_events_are_emitted(make_engine):
    engine, rec = await make_engine()
    prompt = list(range(100, 140))
    first = await collect(engine, req("a", prompt, 2))
    second = await collect(engine, req("b", [*prompt, 7, 8, 9, 10, 11], 2))
    assert first[-1].usage.cached_tokens == 0
    assert second[-1].usage.cached_tokens == 40
    stored = [e for e in rec.events if isinstance(e, BlockStored)]
    assert stored[0].parent_hash is None and stored[0].token_ids == prompt


async def test_stop_token_ends_with_stop_and_is_not_returned(make_engine):
    engine, _ = await make_engine()
    prompt = list(range(50, 60))
    free_run = tokens_of(await collect(engine, req("a", prompt, 6)))
    chunks = await collect(engine, req("b", prompt, 6, stop_token_ids=[free_run[2]]))
    assert tokens_of(chunks) == free_run[:2]
    assert chunks[-1].finish_reason == "stop" and chunks[-1].usage.completion_tokens == 2
    min_tok = await collect(engine, req("c", prompt, 6, stop_token_ids=[free_run[2]], min_tokens=4))
    assert tokens_of(min_tok) == free_run[:6]


async def test_eos_only_when_asked_and_ignore_eos_wins(make_engine):
    engine, _ = await make_engine(eos_probability=1.0)
    base = req("a", [5, 6, 7], 5)
    eos = base.model_copy(update={"eos_token_ids": [2]})
    assert (await collect(engine, base))[-1].finish_reason == "length"  # no eos ids: never eos
    chunks = await collect(engine, eos)
    assert chunks[-1].finish_reason == "stop" and tokens_of(chunks) == []
    ignored = eos.model_copy(update={"stop": StopConditions(max_tokens=5, ignore_eos=True)})
    assert (await collect(engine, ignored))[-1].finish_reason == "length"
    at_least = eos.model_copy(update={"stop": StopConditions(max_tokens=5, min_tokens=3)})
    chunks = await collect(engine, at_least)
    assert chunks[-1].finish_reason == "stop" and len(tokens_of(chunks)) == 3 and 2 not in tokens_of(chunks)


async def test_concurrent_requests_are_batched(make_engine):
    engine, rec = await make_engine()
    results = await asyncio.gather(*(collect(engine, req(f"r{i}", [i + 3] * 9, 6)) for i in range(12)))
    assert all(r[-1].finish_reason == "length" and len(tokens_of(r)) == 6 for r in results)
    assert max(s.running for s in rec.loads) > 1
    assert rec.loads[-1].running == 0 and rec.loads[-1].active_blocks == 0


async def test_full_cache_preempts_and_every_request_still_completes(make_engine):
    engine, _ = await make_engine(num_kv_blocks=6)
    results = await asyncio.gather(*(collect(engine, req(f"r{i}", [i + 3] * 4, 10)) for i in range(3)))
    assert all(r[-1].finish_reason == "length" and len(tokens_of(r)) == 10 for r in results)
    assert engine.kv.active_blocks == 0


async def test_closing_the_stream_aborts_and_frees_blocks(make_engine):
    engine, rec = await make_engine(speedup=1)
    stream = engine.generate(req("long", list(range(3, 43)), 10_000))
    async with asyncio.timeout(20):
        first = await anext(stream)
    assert first.token_ids and engine.kv.active_blocks > 0
    await stream.aclose()
    assert engine.kv.active_blocks == 0
    assert rec.loads[-1].running == 0 and rec.loads[-1].waiting == 0


async def test_cancelling_the_consumer_task_frees_blocks(make_engine):
    engine, _ = await make_engine(speedup=1)
    started = asyncio.Event()

    async def consume():
        async for _ in engine.generate(req("long", list(range(3, 43)), 10_000)):
            started.set()

    task = asyncio.create_task(consume())
    async with asyncio.timeout(20):
        await started.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert engine.kv.active_blocks == 0


@pytest.mark.parametrize(
    ("kw", "request_", "expected"),
    [
        ({"context_length": 16}, req("a", list(range(20))), "context length is 16"),
        ({"num_kv_blocks": 2}, req("a", list(range(20))), "raise --num-kv-blocks"),
        ({"disaggregation_mode": "decode"}, req("a", [1, 2]), "needs bootstrap_info"),
    ],
)
async def test_requests_it_cannot_serve_get_invalid_request(make_engine, kw, request_, expected):
    engine, _ = await make_engine(**kw)
    chunks = await collect(engine, request_)
    assert len(chunks) == 1 and chunks[0].error is not None
    assert chunks[0].error.type == "invalid_request" and expected in chunks[0].error.message


async def test_max_tokens_is_capped_by_the_context_length(make_engine):
    engine, _ = await make_engine(context_length=24)
    chunks = await collect(engine, req("a", list(range(3, 23)), 100))
    assert len(tokens_of(chunks)) == 4 and chunks[-1].finish_reason == "length"


async def test_dp_ranks_have_their_own_cache_and_events(make_engine):
    """--dp-size 2: a request goes to its data_parallel_rank (or the ranks in turn), finds only that
    rank's cache, and the rank's KV events carry its number."""
    engine, rec = await make_engine(dp_size=2, num_kv_blocks=64)
    prompt = list(range(10, 30))
    routed = lambda rid, rank: req(rid, prompt, 2).model_copy(update={"data_parallel_rank": rank})  # noqa: E731
    first = await collect(engine, routed("a", 1))
    assert first[-1].usage.cached_tokens == 0
    assert set(rec.ranks) == {1}
    again = await collect(engine, routed("b", 1))
    assert again[-1].usage.cached_tokens == 19  # all 5 blocks; the last token is always recomputed
    other = await collect(engine, routed("c", 0))
    assert other[-1].usage.cached_tokens == 0  # rank 0 has its own, empty cache
    assert set(rec.ranks) == {0, 1}
    assert engine.kvs[0].cached_blocks > 0 and engine.kvs[1].cached_blocks > 0
    # requests naming no rank alternate between the ranks
    unnamed = [
        await collect(engine, req(f"u{i}", list(range(100 + 40 * i, 120 + 40 * i)), 2)) for i in range(2)
    ]
    assert all(c[-1].finish_reason == "length" for c in unnamed)
    bad = await collect(engine, routed("d", 2))
    assert bad[-1].error is not None and "dp_size=2" in bad[-1].error.message


@dataclasses.dataclass(frozen=True)
class _RecordingTiming(TimingModel):
    """The mocker's timing model, recording the host tokens each step is charged load-back time for."""

    loaded: list[int] = dataclasses.field(default_factory=list)

    def load_back_s(self, tokens: int) -> float:
        self.loaded.append(tokens)
        return super().load_back_s(tokens)


async def test_hicache_host_hits_count_apart_and_cost_load_back_time(make_engine):
    """With --enable-hierarchical-cache the blocks of a prompt evicted from the GPU return as host hits:
    usage counts them in cached_tokens and in cached_tokens_host (the GPU hits only in the first), and
    the step pays load-back time, far less than the prefill it saves."""
    engine, rec = await make_engine(
        num_kv_blocks=12, enable_hierarchical_cache=True, hicache_ratio=4, speedup=1, host_load_gb_s=50
    )
    first = list(range(100, 132))  # 8 blocks
    await collect(engine, req("a", first, max_tokens=1))
    await collect(engine, req("b", list(range(300, 332)), max_tokens=1))  # evicts a's last 4 blocks
    assert {e.medium for e in rec.events if isinstance(e, BlockStored)} == {"gpu", "host"}
    charged: list[int] = []
    model = engine.timing
    fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.init}
    engine.timing = _RecordingTiming(**fields, loaded=charged)
    back = await collect(engine, req("c", [*first, 1], max_tokens=1))
    usage = back[-1].usage
    assert usage is not None and (usage.cached_tokens, usage.cached_tokens_host) == (32, 16)
    assert 16 in charged  # the step paid load-back for the 16 host tokens, not a prefill of them
    assert model.load_back_s(16) < model.prefill_s(16) - model.prefill_s(0)
