"""A worker writes each chunk as one NDJSON line without its default fields; the common chunk (token
ids only) written directly is byte for byte what the model's own serializer writes."""

from __future__ import annotations

import pytest
from dynamo_worker.protocol import GenerateChunk, TokenLogprob, Usage, WorkerError
from dynamo_worker.runtime.request_plane.wire import _line

CHUNKS = [
    GenerateChunk(token_ids=[5]),
    GenerateChunk(token_ids=[0, 7, 151_643]),
    GenerateChunk(),
    GenerateChunk(token_ids=[3], logprobs=[TokenLogprob(token_id=3, logprob=-0.25)]),
    GenerateChunk(token_ids=[1], finish_reason="stop", usage=Usage(prompt_tokens=2, completion_tokens=1)),
    GenerateChunk(finish_reason="error", error=WorkerError(type="engine_error", message="boom")),
    GenerateChunk(embeddings=["AAAA"], finish_reason="stop"),
]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_a_line_is_the_chunk_without_defaults(chunk):
    line = _line(chunk)
    assert line == chunk.model_dump_json(exclude_defaults=True).encode() + b"\n"
    assert GenerateChunk.model_validate_json(line) == chunk
