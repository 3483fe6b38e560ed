"""The frontend end to end with real mocker workers and a real nats-server, driven by the official
``openai`` client: chat and completions, streamed and not; usage counts equal the tokenizer's counts;
stop strings; unknown model (404); malformed JSON and bad fields (400); no workers (503)."""

from __future__ import annotations

import aiohttp
import openai
import pytest
from dynamo_worker.frontend.models.preprocessor import Preprocessor
from dynamo_worker.frontend.requests.job import WHOLE_ANSWER_INTERVAL

MODEL = "tiny"  # the served name the ``mockers`` fixture registers

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "Tell me a story about a robot who learns to paint."}]


def client(fe) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.fixture
async def served(mockers, frontend_factory, wait_workers):
    m = mockers("null")
    fe = await frontend_factory()
    await wait_workers(fe, 1, mockers=[m])
    async with client(fe) as c:
        yield fe, c


async def test_chat_non_stream_usage_matches_tokenizer(served, tiny_model):
    _fe, c = served
    r = await c.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, extra_body={"ignore_eos": True}
    )
    expected_prompt = len(Preprocessor.from_dir(tiny_model).encode_chat(MESSAGES))
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.usage.prompt_tokens == expected_prompt
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == expected_prompt + 12
    assert r.usage.prompt_tokens_details is not None


async def test_chat_stream_equals_non_stream_and_reports_usage(served):
    _fe, c = served
    kwargs = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_completion_tokens": 16,
        "seed": 7,
        "extra_body": {"ignore_eos": True},
    }
    whole = await c.chat.completions.create(**kwargs)
    stream = await c.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    text, finish, usage, roles = "", None, None, []
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert roles == ["assistant"]
    assert text == whole.choices[0].message.content
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == 16
    assert usage.prompt_tokens == whole.usage.prompt_tokens


async def test_completions_stream_and_not(served, tiny_model):
    _fe, c = served
    prompt = "The quick brown fox"
    whole = await c.completions.create(
        model=MODEL, prompt=prompt, max_tokens=10, seed=3, extra_body={"ignore_eos": True}
    )
    assert whole.usage.prompt_tokens == len(Preprocessor.from_dir(tiny_model).encode_prompt(prompt))
    assert whole.usage.completion_tokens == 10
    stream = await c.completions.create(
        model=MODEL, prompt=prompt, max_tokens=10, seed=3, stream=True, extra_body={"ignore_eos": True}
    )
    text = "".join([ch.choices[0].text async for ch in stream if ch.choices])
    assert text == whole.choices[0].text


async def test_an_answer_read_whole_is_handed_over_in_batches_and_is_the_same(served):
    """A non-streamed request without stop strings asks the worker for its tokens every
    ``WHOLE_ANSWER_INTERVAL`` steps (SGLang's ``stream_interval``): the answer is the streamed one, token
    for token, over several batches. A streamed request, or one with a stop string, keeps every step. The
    frontend's request client is wrapped to read what crossed the request plane (the worker, the plane
    and the answer are real)."""
    fe, c = served
    sent, client_generate = [], fe.client.generate

    def recording(address, request, **kw):
        sent.append(request)
        return client_generate(address, request, **kw)

    fe.client.generate = recording
    kwargs = {"model": MODEL, "prompt": [5, 6, 7, 8, 9], "max_tokens": 120, "seed": 11}
    body = {"ignore_eos": True}
    whole = await c.completions.create(**kwargs, extra_body=body)
    stream = await c.completions.create(**kwargs, stream=True, extra_body=body)
    text = "".join([ch.choices[0].text async for ch in stream if ch.choices])
    await c.completions.create(**kwargs, stop=["zzz-never"], extra_body=body)
    assert whole.usage.completion_tokens == 120 and text == whole.choices[0].text
    assert [r.stream_interval for r in sent] == [WHOLE_ANSWER_INTERVAL, None, None]


async def test_completions_default_max_tokens_and_token_prompt(served):
    _fe, c = served
    r = await c.completions.create(model=MODEL, prompt=[5, 6, 7, 8, 9], extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 16


async def test_stop_string_cuts_output_and_never_leaks(served):
    _fe, c = served
    kwargs = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 40,
        "seed": 11,
        "extra_body": {"ignore_eos": True},
    }
    full = (await c.completions.create(**kwargs)).choices[0].text
    assert len(full) > 30
    stop = full[len(full) // 2 : len(full) // 2 + 4]
    expected = full[: full.index(stop)]
    r = await c.completions.create(**kwargs, stop=[stop])
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 40
    stream = await c.completions.create(**kwargs, stop=stop, stream=True)
    pieces = [ch.choices[0].text async for ch in stream if ch.choices]
    assert "".join(pieces) == expected
    assert all(stop not in p for p in pieces)


async def test_stop_token_ids(served, tiny_model):
    _fe, c = served
    kwargs = {"model": MODEL, "prompt": "Hello, world!", "max_tokens": 30, "seed": 5}
    first = await c.completions.create(**kwargs, extra_body={"ignore_eos": True})
    ids = (
        Preprocessor.from_dir(tiny_model)
        .tokenizer.encode(first.choices[0].text, add_special_tokens=False)
        .ids
    )
    stop_id = ids[len(ids) // 2]
    r = await c.completions.create(**kwargs, extra_body={"ignore_eos": True, "stop_token_ids": [stop_id]})
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 30


@pytest.mark.parametrize(
    ("kind", "body", "param"),
    [
        ("chat", {"stop_token_ids": [5, 2**64]}, "stop_token_ids[1]"),
        ("completion", {"stop_token_ids": [2**70]}, "stop_token_ids[0]"),
        ("chat", {"top_k": 2**64}, "top_k"),
        ("completion", {"prompt": [1, 2**64]}, "prompt[1]"),
    ],
)
async def test_ids_and_integers_past_the_engines_range_are_a_400_naming_the_field(served, kind, body, param):
    """Found by the fuzz pass: a stop token id of 2**64 reached the request plane's encoder (a 500)."""
    _fe, c = served
    with pytest.raises(openai.BadRequestError) as e:
        if kind == "chat":
            await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, extra_body=body)
        else:
            await c.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body=body)
    assert e.value.body["param"] == param


async def test_unknown_model_is_404(served):
    _fe, c = served
    with pytest.raises(openai.NotFoundError) as e:
        await c.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert e.value.body["param"] == "model"


async def test_bad_fields_are_400(served):
    _fe, c = served
    with pytest.raises(openai.BadRequestError) as e:
        await c.chat.completions.create(model=MODEL, messages=MESSAGES, n=2)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        await c.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=5)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        await c.completions.create(model=MODEL, prompt="x", max_tokens=10**7)
    assert e.value.body["param"] == "max_tokens"


async def test_malformed_json_is_400(served):
    fe, _ = served
    async with aiohttp.ClientSession() as s:
        r = await s.post(
            fe.url + "/v1/chat/completions", data=b'{"model": ', headers={"Content-Type": "application/json"}
        )
        body = await r.json()
    assert r.status == 400 and body["error"]["code"] == "invalid_json"


async def test_models_lists_served_model(served):
    _fe, c = served
    models = await c.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert (await c.models.retrieve(MODEL)) == models.data[0]
    with pytest.raises(openai.NotFoundError) as e:
        await c.models.retrieve("nope")
    assert e.value.body["code"] == "model_not_found" and MODEL in e.value.message


async def test_no_workers_is_503(frontend_factory):
    fe = await frontend_factory()
    async with client(fe) as c:
        with pytest.raises(openai.InternalServerError) as e:
            await c.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert e.value.status_code == 503 and e.value.body["code"] == "no_workers"
    async with aiohttp.ClientSession() as s:
        r = await s.get(fe.url + "/health")
        assert r.status == 503
