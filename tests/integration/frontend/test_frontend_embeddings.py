"""``POST /v1/embeddings`` through the real stack: the official ``openai`` client against our frontend
process, an embedding mocker worker (``--is-embedding``) and a generation one over the real request
plane and nats-server: the four input forms, base64, dimensions, usage, the model list, wrong-endpoint
answers, and the batching of concurrent small requests into fewer worker requests."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import re
import struct
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.integration.frontend.features_stack import Stack, start_stack, stop_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(nats_server, tiny_model, tmp_path_factory) -> Iterator[Stack]:
    s = start_stack(nats_server.url, tiny_model, tmp_path_factory.mktemp("embeddings"), window_ms=100.0)
    yield s
    stop_stack(s)


@pytest.fixture(scope="module")
def client(stack) -> Iterator[OpenAI]:
    with OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0, timeout=30) as c:
        yield c


def norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def test_all_four_input_forms_give_unit_vectors_that_agree(client):
    one = client.embeddings.create(model="embed", input="the quick brown fox")
    ids = client.embeddings.create(model="embed", input=[5, 6, 7])
    many = client.embeddings.create(model="embed", input=["the quick brown fox", "hello world"])
    many_ids = client.embeddings.create(model="embed", input=[[5, 6, 7], [8, 9]])
    for r, n in ((one, 1), (ids, 1), (many, 2), (many_ids, 2)):
        assert r.object == "list" and r.model == "embed" and len(r.data) == n
        assert [d.index for d in r.data] == list(range(n))
        for d in r.data:
            assert d.object == "embedding" and len(d.embedding) == 64
            assert abs(norm(d.embedding) - 1.0) < 1e-5  # float32 on the wire
    assert many.data[0].embedding == one.data[0].embedding  # same text, same vector, batched or not
    assert many_ids.data[0].embedding == ids.data[0].embedding
    assert many.data[0].embedding != many.data[1].embedding
    assert ids.usage.prompt_tokens == ids.usage.total_tokens == 3
    assert many_ids.usage.prompt_tokens == 5


def test_base64_is_little_endian_float32_of_the_same_vector(stack, client):
    floats = client.embeddings.create(model="embed", input="hello", encoding_format="float").data[0].embedding
    req = urllib.request.Request(
        stack.url + "/v1/embeddings",
        data=json.dumps({"model": "embed", "input": "hello", "encoding_format": "base64"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        encoded = json.loads(r.read())["data"][0]["embedding"]
    decoded = struct.unpack(f"<{len(floats)}f", base64.b64decode(encoded))
    assert list(decoded) == floats  # the same float32 values


def test_many_large_vectors_come_back_whole(client):
    # 40 x 4096 floats: the worker streams them over several request-plane chunks
    r = client.embeddings.create(model="embed-big", input=[[i + 1, i + 2] for i in range(40)])
    assert len(r.data) == 40 and all(len(d.embedding) == 4096 for d in r.data)
    assert all(abs(norm(d.embedding) - 1.0) < 1e-5 for d in r.data)
    alone = client.embeddings.create(model="embed-big", input=[[21, 22]])
    assert alone.data[0].embedding == r.data[20].embedding


def test_matryoshka_models_shorten_vectors_to_the_sizes_they_list(client):
    full = client.embeddings.create(model="embed-mrl", input="hello world").data[0].embedding
    short = client.embeddings.create(model="embed-mrl", input="hello world", dimensions=16).data[0].embedding
    assert len(full) == 64 and len(short) == 16 and abs(norm(short) - 1.0) < 1e-5
    head = full[:16]
    assert all(
        abs(a - b / norm(head)) < 1e-5 for a, b in zip(short, head, strict=True)
    )  # renormalized prefix
    same = client.embeddings.create(model="embed-mrl", input="hello world", dimensions=64).data[0].embedding
    assert same == full
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="embed-mrl", input="hello", dimensions=20)
    assert e.value.body["param"] == "dimensions" and "[16, 32, 64]" in e.value.body["message"]


def test_models_lists_embedding_and_generation_models(client):
    ids = {m.id for m in client.models.list().data}
    assert {"embed", "qwen", "llama3"} <= ids


def test_wrong_endpoint_and_bad_inputs_are_400_naming_the_field(stack, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="embed", messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["param"] == "model" and "/v1/embeddings" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="qwen", input="hi")
    assert e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="embed", input="hi", dimensions=16)
    assert e.value.body["param"] == "dimensions" and "Matryoshka" in e.value.body["message"]
    assert len(client.embeddings.create(model="embed", input="hi", dimensions=64).data[0].embedding) == 64
    for body, param in (
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [[1, 2], []]}, "input"),  # a union's error names the field, its message the item
        ({"input": [1, 10**7]}, "input"),
        ({"input": [[1], [2, 10**7]]}, "input[1]"),
        ({"input": ["ok", ""]}, "input"),
        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": 5}, "input"),
    ):
        req = urllib.request.Request(
            stack.url + "/v1/embeddings",
            data=json.dumps({"model": "embed"} | body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 400
        error = json.loads(err.value.read())["error"]
        assert error["param"] == param, (body, error)
        if param == "input" and isinstance(body["input"], list) and len(body["input"]) == 2:
            assert "input[1]" in error["message"] or "10000000" in error["message"], error


def _worker_requests(stack: Stack) -> float:
    text = stack.metrics("embed")
    return sum(
        float(v) for v in re.findall(r'^dynamo_worker_requests_total\{outcome="stop"\} (\S+)$', text, re.M)
    )


async def test_concurrent_small_requests_are_batched_into_fewer_worker_requests(stack):
    before = _worker_requests(stack)
    async with AsyncOpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0, timeout=30) as c:
        texts = [f"sentence number {i}" for i in range(16)]
        answers = await asyncio.gather(*(c.embeddings.create(model="embed", input=t) for t in texts))
        alone = await c.embeddings.create(model="embed", input=texts[3])
    assert [len(a.data) for a in answers] == [1] * 16
    assert answers[3].data[0].embedding == alone.data[0].embedding  # each got its own vector back
    sent = _worker_requests(stack) - before - 1
    assert 1 <= sent < 16, sent
