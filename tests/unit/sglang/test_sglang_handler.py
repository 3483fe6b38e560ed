"""The SGLang request handler: one GenerateRequest -> one ``async_generate`` call -> GenerateChunks.

Runs against ``tests.support.sglang_fake.FakeSglangEngine`` because SGLang needs a GPU, which this
machine lacks; the fake has SGLang 0.5.17's ``async_generate`` signature (checked against the source in
test_sglang_compat.py) and its output shapes. Covers the three roles, finish reasons, usage, errors and
that cancellation aborts the SGLang request, also before the first token.
"""

from __future__ import annotations

import asyncio

import pytest
from dynamo_worker.protocol import BootstrapInfo, GenerateRequest, SamplingOptions, StopConditions, Usage
from dynamo_worker.sglang import handler

from tests.support.sglang_fake import FakeServerArgs, FakeSglangEngine, eventually

PROMPT = [11, 12, 13, 14, 15]


def request(max_tokens: int = 6, *, room: int | None = None, **kw) -> GenerateRequest:
    boot = (
        BootstrapInfo(bootstrap_host="10.0.0.5", bootstrap_port=8998, bootstrap_room=room) if room else None
    )
    return GenerateRequest(
        request_id="req-1",
        model="m",
        token_ids=kw.pop("token_ids", PROMPT),
        stop=StopConditions(max_tokens=max_tokens, **kw.pop("stop", {})),
        bootstrap_info=boot,
        **kw,
    )


def fake(mode: str = "null", **kw) -> FakeSglangEngine:
    return FakeSglangEngine(server_args=FakeServerArgs(disaggregation_mode=mode), **kw)


async def collect(engine, req, role="agg", rid="rid-1"):
    return [c async for c in handler.stream_request(engine, req, role, rid)]


async def test_agg_streams_disjoint_tokens_then_length_with_usage():
    engine = fake()
    chunks = await collect(engine, request(6))
    tokens = [t for c in chunks for t in c.token_ids]
    assert tokens == engine.expected_tokens(PROMPT, 6)
    assert [c.finish_reason for c in chunks] == [None] * 5 + ["length"]
    assert chunks[-1].usage == Usage(prompt_tokens=5, completion_tokens=6, cached_tokens=0)
    again = await collect(engine, request(2), rid="rid-2")
    assert again[-1].usage.cached_tokens == len(PROMPT)
    call = engine.calls[0]
    assert call["stream"] is True and call["rid"] == "rid-1" and call["input_ids"] == PROMPT
    assert "bootstrap_host" not in call


async def test_eos_ends_with_stop_and_the_eos_id_is_not_streamed():
    engine = fake()
    eos = engine.expected_tokens(PROMPT, 3)[2]
    engine.eos_token_id = eos
    chunks = await collect(engine, request(10, eos_token_ids=[eos]))
    assert [t for c in chunks for t in c.token_ids] == engine.expected_tokens(PROMPT, 2)
    assert chunks[-1].finish_reason == "stop"
    assert eos in engine.calls[0]["sampling_params"]["stop_token_ids"]


async def test_ignore_eos_does_not_send_eos_as_a_stop_id():
    params = handler.sampling_params(request(4, eos_token_ids=[2], stop={"ignore_eos": True}), "agg")
    assert params["stop_token_ids"] is None and params["ignore_eos"] is True


def test_sampling_params_map_our_options_to_sglang_names():
    req = request(
        9,
        sampling=SamplingOptions(temperature=0.0, top_p=0.5, top_k=3, min_p=0.1, seed=4),
        stop={"min_tokens": 2, "stop_token_ids": [5]},
        eos_token_ids=[2],
    )
    assert handler.sampling_params(req, "decode") == {
        "max_new_tokens": 9,
        "min_new_tokens": 2,
        "temperature": 0.0,
        "top_p": 0.5,
        "top_k": 3,
        "min_p": 0.1,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "sampling_seed": 4,
        "stop_token_ids": [2, 5],
        "ignore_eos": False,
        "json_schema": None,  # no grammar: SGLang's own defaults
        "regex": None,
        "ebnf": None,
        "structural_tag": None,
        "stream_interval": None,  # every step: SGLang's server default
    }
    batched = request(9, stream_interval=50)
    assert handler.sampling_params(batched, "agg")["stream_interval"] == 50
    assert handler.generate_kwargs(batched, "agg", "rid-1")["stream"] is True  # still a stream
    prefill = handler.sampling_params(req, "prefill")
    assert prefill["max_new_tokens"] == 1 and prefill["min_new_tokens"] == 0


async def test_prefill_and_decode_legs_pair_on_one_room():
    prefill_engine, decode_engine = fake("prefill"), fake("decode")
    decode_engine._finished_rooms = prefill_engine._finished_rooms  # one "KV transfer" between them
    req = request(4, room=77, data_parallel_rank=0)
    pre, dec = await asyncio.gather(
        collect(prefill_engine, req, "prefill"), collect(decode_engine, req, "decode", rid="rid-d")
    )
    assert pre[-1].finish_reason == "length" and pre[-1].usage.completion_tokens == 1
    assert [t for c in dec for t in c.token_ids] == decode_engine.expected_tokens(PROMPT, 4)
    for engine in (prefill_engine, decode_engine):
        call = engine.calls[0]
        assert (call["bootstrap_host"], call["bootstrap_port"], call["bootstrap_room"]) == (
            "10.0.0.5",
            8998,
            77,
        )
    assert prefill_engine.calls[0]["sampling_params"]["max_new_tokens"] == 1
    assert "routed_dp_rank" not in decode_engine.calls[0]  # 0 is dropped by the fake's recorder
    assert (
        handler.generate_kwargs(request(2, room=5, data_parallel_rank=1), "decode", "r")["routed_dp_rank"]
        == 1
    )


@pytest.mark.parametrize("role", ["prefill", "decode"])
async def test_disaggregated_leg_without_bootstrap_info_is_an_invalid_request(role):
    chunks = await collect(fake(role), request(3), role)
    assert len(chunks) == 1 and chunks[0].error.type == "invalid_request"
    assert "bootstrap_info" in chunks[0].error.message


async def test_request_sglang_refuses_is_an_invalid_request():
    engine = fake(max_input_len=3)
    chunks = await collect(engine, request(3))
    assert chunks[-1].finish_reason == "error" and chunks[-1].error.type == "invalid_request"
    assert engine.tokenizer_manager.aborted == []


@pytest.mark.parametrize(
    ("message", "error_type"),
    [
        ("Decode transfer failed for request rank=0 rid='x' bootstrap_room=1", "bootstrap_failed"),
        ("Prefill bootstrap failed for request rank=0", "bootstrap_failed"),
        ("Request running timeout reached.", "engine_error"),
    ],
)
async def test_sglang_abort_becomes_a_typed_error(message, error_type):
    chunks = await collect(fake(abort_message=message), request(3))
    assert chunks[-1].finish_reason == "error"
    assert chunks[-1].error.type == error_type and message in chunks[-1].error.message


def test_finish_reason_mapping():
    assert handler.finish_from_meta({"finish_reason": None}) == (None, None)
    assert handler.finish_from_meta({"finish_reason": {"type": "length", "length": 3}}) == ("length", None)
    assert handler.finish_from_meta({"finish_reason": {"type": "stop", "matched": 2}}) == ("stop", None)
    reason, error = handler.finish_from_meta(
        {"finish_reason": {"type": "abort", "status_code": 400, "message": "x"}}
    )
    assert reason == "error" and error.type == "invalid_request"


async def test_cancelling_before_the_first_token_aborts_the_sglang_request():
    gate = asyncio.Event()
    engine = fake(first_token_gate=gate)
    started = asyncio.Event()

    async def consume():
        async for _ in handler.stream_request(engine, request(5), "agg", "rid-cancel"):
            started.set()

    task = asyncio.create_task(consume())
    await eventually(lambda: "rid-cancel" in engine.abort_events, 5, "request queued, no token yet")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.tokenizer_manager.aborted == ["rid-cancel"]
    assert not started.is_set()


async def test_closing_the_stream_midway_aborts_the_sglang_request():
    engine = fake(token_delay_s=0.01)
    stream = handler.stream_request(engine, request(50), "agg", "rid-close")
    first = await anext(stream)
    assert first.token_ids and first.finish_reason is None
    await stream.aclose()
    assert engine.tokenizer_manager.aborted == ["rid-close"]


async def test_a_finished_request_is_not_aborted():
    engine = fake()
    await collect(engine, request(3))
    assert engine.tokenizer_manager.aborted == []


async def test_a_call_sglang_rejects_upfront_is_an_invalid_request():
    class RejectsDpRank(FakeSglangEngine):
        async def async_generate(self, **kwargs):
            raise ValueError("routed_dp_rank=3 out of range [0, 2)")

    engine = RejectsDpRank()
    chunks = await collect(engine, request(3, data_parallel_rank=3))
    assert chunks[-1].error.type == "invalid_request" and "out of range" in chunks[-1].error.message
    assert engine.tokenizer_manager.aborted == []


async def test_images_for_a_model_without_image_tokens_are_refused_not_served_from_their_pad_ids():
    from dynamo_worker.protocol import ImageEmbedding, ImageSpan, image_pad_id

    digest = "ab" * 32
    emb = ImageEmbedding(
        content_hash=digest,
        num_tokens=2,
        hidden_size=2,
        dtype="float16",
        width=8,
        height=8,
        data="A" * 11 + "=",
    )
    pad = image_pad_id(digest)
    req = request(3, token_ids=[1, pad, pad, 2], images=[ImageSpan(offset=1, embedding=emb)])
    engine = fake()
    chunks = await collect(engine, req)
    assert len(chunks) == 1 and chunks[0].error.type == "invalid_request"
    assert "takes no images" in chunks[0].error.message and engine.calls == []
