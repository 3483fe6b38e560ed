"""Wire models of the request features: one grammar at a time, an embedding request's first input is
its routing prompt, and vectors travel as OpenAI's base64 float32 in chunks small enough to read."""

from __future__ import annotations

import pytest
from dynamo_worker.protocol import (
    MAX_EMBEDDING_CHUNK_BYTES,
    EmbedOptions,
    GenerateChunk,
    GenerateRequest,
    StopConditions,
    StructuredOutput,
    Usage,
    embedding_chunks,
    pack_vector,
    unpack_vector,
)
from pydantic import ValidationError


def test_structured_output_takes_exactly_one_grammar():
    assert StructuredOutput(regex="a+").regex == "a+"
    for bad in ({}, {"regex": "a", "ebnf": "b"}):
        with pytest.raises(ValidationError):
            StructuredOutput(**bad)


def test_embedding_request_routes_on_its_first_input():
    stop = StopConditions(max_tokens=1)
    GenerateRequest(
        request_id="r", model="m", token_ids=[1], stop=stop, embed=EmbedOptions(inputs=[[1], [2]])
    )
    with pytest.raises(ValidationError, match=r"embed\.inputs"):
        GenerateRequest(request_id="r", model="m", token_ids=[2], stop=stop, embed=EmbedOptions(inputs=[[1]]))


def test_vectors_round_trip_as_float32_and_split_into_readable_chunks():
    vector = [0.5, -1.25, 3.0e-3]
    assert unpack_vector(pack_vector(vector)) == pytest.approx(vector, rel=1e-6)
    big = [[float(i)] * 4096 for i in range(10)]  # ~22 KiB of base64 each
    chunks = embedding_chunks(big, Usage(prompt_tokens=10, completion_tokens=0))
    assert len(chunks) > 1 and chunks[-1].finish_reason == "stop" and chunks[-1].usage.prompt_tokens == 10
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert [unpack_vector(v)[0] for c in chunks for v in c.embeddings] == [float(i) for i in range(10)]
    for c in chunks:
        line = c.model_dump_json(exclude_defaults=True)
        assert len(line) <= MAX_EMBEDDING_CHUNK_BYTES + 200 or len(c.embeddings) == 1
        assert GenerateChunk.model_validate_json(line) == c
