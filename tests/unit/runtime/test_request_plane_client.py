"""Chunks a frontend reads together from a worker's stream are handed on as few chunks, losing nothing:
token ids and their logprobs stay aligned, embeddings and errors are never merged into other chunks,
and the tokens before the final chunk reach the client in it."""

from __future__ import annotations

from dynamo_worker.protocol import GenerateChunk, TokenLogprob, Usage, WorkerError
from dynamo_worker.runtime.request_plane.client import _coalesce


def lp(token: int) -> TokenLogprob:
    return TokenLogprob(token_id=token, logprob=-0.5)


def test_token_chunks_become_one_and_go_into_the_final_chunk():
    final = GenerateChunk(
        token_ids=[3], finish_reason="length", usage=Usage(prompt_tokens=4, completion_tokens=3)
    )
    out = _coalesce([GenerateChunk(token_ids=[1]), GenerateChunk(token_ids=[2]), final])
    assert len(out) == 1
    assert out[0].token_ids == [1, 2, 3] and out[0].finish_reason == "length"


def test_logprobs_stay_aligned_with_their_tokens():
    out = _coalesce([GenerateChunk(token_ids=[t], logprobs=[lp(t)]) for t in (5, 6, 7)])
    assert [c.token_ids for c in out] == [[5, 6, 7]]
    assert [x.token_id for x in out[0].logprobs] == [5, 6, 7]


def test_embedding_chunks_are_each_kept():
    chunks = [GenerateChunk(embeddings=["AAAA"]), GenerateChunk(embeddings=["BBBB"])]
    chunks.append(GenerateChunk(embeddings=["CCCC"], finish_reason="stop"))
    assert _coalesce(chunks) == chunks


def test_an_error_does_not_swallow_the_tokens_before_it():
    error = GenerateChunk(finish_reason="error", error=WorkerError(type="engine_error", message="boom"))
    out = _coalesce([GenerateChunk(token_ids=[1]), GenerateChunk(token_ids=[2]), error])
    assert [c.token_ids for c in out] == [[1, 2], []]
    assert out[1].error is not None


def test_nothing_after_the_final_chunk_is_passed_on():
    out = _coalesce([GenerateChunk(token_ids=[1], finish_reason="stop"), GenerateChunk(token_ids=[9])])
    assert [c.token_ids for c in out] == [[1]]
