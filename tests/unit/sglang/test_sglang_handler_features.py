"""The SGLang worker's side of the request features, against the keyword names of SGLang 0.5.17
(``compat`` checks them against its source): grammars in ``sampling_params``, logprobs asked with
``return_logprob`` / ``top_logprobs_num`` / ``logprob_start_len`` and read from ``meta_info``, and
embedding requests as one batched ``EmbeddingReqInput``. SGLang's engine cannot run without a GPU, so
the embedding tests use a stand-in tokenizer manager that answers like SGLang's (documented here)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from dynamo_worker.protocol import (
    EmbedOptions,
    GenerateRequest,
    StopConditions,
    StructuredOutput,
    unpack_vector,
)
from dynamo_worker.sglang import handler


def request(**kw: Any) -> GenerateRequest:
    return GenerateRequest(
        request_id="r1", model="m", token_ids=[1, 2, 3], stop=StopConditions(max_tokens=8), **kw
    )


def test_grammars_go_in_sampling_params_under_sglangs_names():
    params = handler.sampling_params(
        request(structured=StructuredOutput(json_schema='{"type": "object"}')), "agg"
    )
    assert params["json_schema"] == '{"type": "object"}' and params["regex"] is None
    params = handler.sampling_params(request(structured=StructuredOutput(ebnf='root ::= "a"')), "decode")
    assert params["ebnf"] == 'root ::= "a"' and params["json_schema"] is None


def test_logprobs_are_asked_for_output_tokens_only_and_not_on_a_prefill_leg():
    kwargs = handler.generate_kwargs(request(logprobs=3), "agg", "rid")
    assert kwargs["return_logprob"] is True and kwargs["top_logprobs_num"] == 3
    assert kwargs["logprob_start_len"] == -1
    plain = handler.generate_kwargs(request(), "agg", "rid")
    assert not {"return_logprob", "top_logprobs_num", "logprob_start_len"} & set(plain)
    from dynamo_worker.protocol import BootstrapInfo

    boot = BootstrapInfo(bootstrap_host="h", bootstrap_port=1, bootstrap_room=2)
    prefill = handler.generate_kwargs(request(logprobs=3, bootstrap_info=boot), "prefill", "rid")
    assert "return_logprob" not in prefill


def test_logprobs_from_meta_read_sglangs_tuples():
    meta = {
        "output_token_logprobs": [(-0.5, 11, None), (-1.5, 12, None)],
        "output_top_logprobs": [[(-0.5, 11, None), (-2.0, 40, None)], None],
    }
    lps = handler.logprobs_from_meta(meta, 2)
    assert [(lp.token_id, lp.logprob) for lp in lps] == [(11, -0.5), (12, -1.5)]
    assert [(t.token_id, t.logprob) for t in lps[0].top] == [(11, -0.5), (40, -2.0)] and lps[1].top == []
    assert handler.logprobs_from_meta(meta, 1)[0].token_id == 11  # a stop token cut from the chunk
    assert handler.logprobs_from_meta({}, 2) is None


@dataclass
class StandInTokenizerManager:
    """Answers ``generate_request(EmbeddingReqInput, None)`` like SGLang's for a batch: one async
    iteration yielding a list of ``{"embedding": [...], "meta_info": {"prompt_tokens": n}}``."""

    dim: int = 8
    error: str | None = None
    gate: asyncio.Event | None = None
    received: list[dict] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    entered: asyncio.Event = field(default_factory=asyncio.Event)

    async def generate_request(self, obj: dict, _request: Any):
        self.received.append(obj)
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.error:
            raise ValueError(self.error)
        yield [
            {"embedding": [float(len(ids))] * self.dim, "meta_info": {"prompt_tokens": len(ids)}}
            for ids in obj["input_ids"]
        ]

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.aborted.append(rid)


@dataclass
class StandInEngine:
    tokenizer_manager: StandInTokenizerManager


def embed_request(inputs: list[list[int]], dimensions: int | None = None) -> GenerateRequest:
    return GenerateRequest(
        request_id="e1",
        model="m",
        token_ids=inputs[0],
        stop=StopConditions(max_tokens=1),
        embed=EmbedOptions(inputs=inputs, dimensions=dimensions),
    )


async def collect(engine, req):
    return [c async for c in handler.stream_embedding(engine, req, "rid", lambda **kw: kw)]


async def test_embedding_request_is_one_batch_and_vectors_come_back_in_order():
    tm = StandInTokenizerManager()
    chunks = await collect(StandInEngine(tm), embed_request([[1, 2], [3, 4, 5]], dimensions=4))
    assert tm.received == [{"input_ids": [[1, 2], [3, 4, 5]], "rid": ["rid-0", "rid-1"], "dimensions": 4}]
    vectors = [unpack_vector(v) for c in chunks for v in c.embeddings]
    assert vectors == [[2.0] * 8, [3.0] * 8]
    assert chunks[-1].finish_reason == "stop" and chunks[-1].usage.prompt_tokens == 5


async def test_sglang_refusing_an_embedding_is_the_callers_error():
    tm = StandInTokenizerManager(error="Provided dimensions are greater than max embedding dimension")
    [chunk] = await collect(StandInEngine(tm), embed_request([[1]], dimensions=9999))
    assert chunk.error.type == "invalid_request" and "dimensions" in chunk.error.message


async def test_a_cancelled_embedding_is_aborted_in_sglang():
    tm = StandInTokenizerManager(gate=asyncio.Event())
    task = asyncio.create_task(collect(StandInEngine(tm), embed_request([[1], [2]])))
    async with asyncio.timeout(5):
        await tm.entered.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert tm.aborted == ["rid-0", "rid-1"]
