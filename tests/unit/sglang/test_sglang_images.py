"""Images on the SGLang language worker: pad-id spans -> the model's image tokens and SGLang's one
``image_data`` item (``dynamo_worker.sglang.images``), and the request that reaches ``async_generate``
(the fake has SGLang 0.5.17's signature)."""

from __future__ import annotations

import base64
import hashlib
from types import SimpleNamespace

import pytest
from dynamo_worker.protocol import GenerateRequest, ImageEmbedding, ImageSpan, StopConditions, image_pad_id
from dynamo_worker.sglang import handler
from dynamo_worker.sglang.images import ImageTokens, image_item, image_prompt, image_tokens

from tests.support.sglang_fake import FakeSglangEngine

QWEN = ImageTokens(image=900, start=901, end=902, needs_grid=True)


def embedding(name: str, tokens: int, grid: tuple[int, int, int] | None = (1, 4, 4)) -> ImageEmbedding:
    digest = hashlib.sha256(name.encode()).hexdigest()
    data = base64.b64encode(bytes(range(tokens * 4 * 2))).decode()
    return ImageEmbedding(
        content_hash=digest, num_tokens=tokens, hidden_size=4, dtype="bfloat16", grid_thw=grid,
        width=56, height=56, data=data,
    )  # fmt: skip


def with_images(before: list[int], *parts: tuple[ImageEmbedding, list[int]]) -> GenerateRequest:
    ids, spans = list(before), []
    for emb, after in parts:
        spans.append(ImageSpan(offset=len(ids), embedding=emb))
        ids += [image_pad_id(emb.content_hash)] * emb.num_tokens + after
    return GenerateRequest(
        request_id="r", model="m", token_ids=ids, stop=StopConditions(max_tokens=2), images=spans
    )


def test_qwen_vl_layout_wraps_each_image_in_vision_start_and_end_like_sglangs_processor():
    a, b = embedding("a", 4), embedding("b", 2, (1, 2, 4))
    ids, embs = image_prompt(with_images([5, 6], (a, [7]), (b, [8, 9])), QWEN)
    assert ids == [5, 6, 901, 900, 900, 900, 900, 902, 7, 901, 900, 900, 902, 8, 9]
    assert embs == [a, b]


def test_start_and_end_tokens_already_in_the_prompt_are_not_doubled():
    a = embedding("a", 2)
    req = with_images([5, 901], (a, [902, 7]))
    assert image_prompt(req, QWEN)[0] == [5, 901, 900, 900, 902, 7]
    assert image_prompt(with_images([], (a, [])), QWEN)[0] == [901, 900, 900, 902]


def test_a_model_without_vision_start_tokens_only_gets_its_image_token():
    a = embedding("a", 3, None)
    assert image_prompt(with_images([1], (a, [2])), ImageTokens(image=77))[0] == [1, 77, 77, 77, 2]


def test_bad_spans_are_value_errors_that_say_why():
    a = embedding("a", 2)
    req = with_images([1], (a, [2]))
    broken = req.model_copy(update={"token_ids": [1, 3, 3, 2]})
    with pytest.raises(ValueError, match="not its pad id"):
        image_prompt(broken, QWEN)
    with pytest.raises(ValueError, match="no grid_thw"):
        image_prompt(with_images([1], (embedding("b", 2, None), [])), QWEN)
    other = embedding("c", 2).model_copy(update={"dtype": "float16"})
    with pytest.raises(ValueError, match="another size or dtype"):
        image_prompt(with_images([1], (a, []), (other, [])), QWEN)


def test_one_processor_output_item_carries_every_image_and_their_grids():
    a, b = embedding("a", 4), embedding("b", 2, (1, 2, 4))

    def tensors(embs):
        return [e.content_hash for e in embs], [e.grid_thw for e in embs]

    item = image_item([a, b], tensors)
    assert item == {
        "format": "processor_output",
        "precomputed_embeddings": [a.content_hash, b.content_hash],
        "image_grid_thw": [(1, 4, 4), (1, 2, 4)],
    }
    assert "image_grid_thw" not in image_item([a], lambda embs: ("x", None))


def test_image_tokens_come_from_the_hf_config():
    qwen = SimpleNamespace(
        image_token_id=151655, vision_start_token_id=151652, vision_end_token_id=151653,
        rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
    )  # fmt: skip
    assert image_tokens(qwen) == ImageTokens(151655, 151652, 151653, needs_grid=True)
    assert image_tokens(SimpleNamespace(image_token_index=32000)) == ImageTokens(32000)
    assert image_tokens(SimpleNamespace(vocab_size=10)) is None


async def test_async_generate_gets_the_image_tokens_and_one_image_data_item():
    engine = FakeSglangEngine()
    a, b = embedding("a", 4), embedding("b", 2, (1, 2, 4))
    req = with_images([5], (a, [6]), (b, [7]))

    def build(r):
        ids, embs = image_prompt(r, QWEN)
        return ids, image_item(embs, lambda es: (len(es), [e.grid_thw for e in es]))

    chunks = [c async for c in handler.stream_request(engine, req, "agg", "rid-1", build)]
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage.prompt_tokens == 13
    call = engine.calls[0]
    assert call["input_ids"] == [5, 901, 900, 900, 900, 900, 902, 6, 901, 900, 900, 902, 7]
    assert call["image_data"] == [
        {"format": "processor_output", "precomputed_embeddings": 2, "image_grid_thw": [(1, 4, 4), (1, 2, 4)]}
    ]


async def test_a_request_without_images_passes_no_image_data():
    engine = FakeSglangEngine()
    req = GenerateRequest(request_id="r", model="m", token_ids=[1, 2], stop=StopConditions(max_tokens=1))
    [c async for c in handler.stream_request(engine, req, "agg", "rid-1", lambda r: ([], {}))]
    assert "image_data" not in engine.calls[0]
