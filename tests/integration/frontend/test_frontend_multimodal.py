"""Images in chat and image generation, end to end on the mocker with the official ``openai`` client, a
real nats-server and worker processes: an image chat request goes processor (frontend) -> encode worker
-> language worker, aggregated and disaggregated; a repeated image is an embedding-cache hit (the encode
worker's metric) and a KV-cache hit on the language worker; bad images, oversize images, private and
unreachable URLs are refused with a 400 naming the problem; images are fetched from a local HTTP
server when private URLs are allowed; /v1/images/generations returns the requested count and format.
An image chat is served or refused as the same chat without its image: ``response_format`` and a
required tool constrain its output, or get the same 400 from workers without a grammar backend;
``logprobs`` come back; its history's tool calls, tool results and reasoning reach the worker."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
from pathlib import Path

import aiohttp
import openai
import pytest
from aiohttp import web
from dynamo_worker.multimodal.images import sniff, write_png

from tests.support.wait import wait_until_async

MODEL = "tiny"

pytestmark = pytest.mark.integration


def png(width: int, height: int, shade: int = 0) -> bytes:
    return write_png(width, height, bytes((shade, 100, 200)) * (width * height))


def noisy_png(width: int, height: int) -> bytes:
    """A PNG that does not compress: its size is about ``width * height * 3`` bytes."""
    return write_png(width, height, os.urandom(width * height * 3))


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def image_message(text: str, *urls: str) -> list[dict]:
    parts = [{"type": "text", "text": text}] + [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": parts}]


def client(fe) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, f"no {name} in metrics"
    return float(found[1])


@pytest.fixture
async def image_server():
    """``await image_server({"/a.png": bytes})`` serves files on 127.0.0.1 and returns the base URL;
    ``/slow.png`` never finishes its body, ``/loop`` redirects to itself."""
    runners: list[web.AppRunner] = []
    never = asyncio.Event()

    async def start(files: dict[str, bytes]) -> str:
        async def serve(request: web.Request) -> web.StreamResponse:
            if request.path == "/loop":
                raise web.HTTPFound("/loop")
            if request.path == "/slow.png":
                response = web.StreamResponse(headers={"Content-Type": "image/png"})
                await response.prepare(request)
                await response.write(b"\x89PNG")
                await never.wait()
                return response
            if request.path not in files:
                raise web.HTTPNotFound()
            return web.Response(body=files[request.path], content_type="image/png")

        app = web.Application()
        app.router.add_get("/{name:.*}", serve)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    never.set()
    for r in runners:
        await r.cleanup()


@pytest.fixture
async def vlm(mockers, frontend_factory, wait_workers):
    """An aggregated language worker, an encode worker and a frontend (private image URLs allowed)."""
    language = mockers("null")
    encoder = mockers("null", "--role", "encode", component="encoder")
    fe = await frontend_factory(
        allow_private_image_urls=True, max_image_bytes=64 * 1024, image_fetch_timeout_s=2
    )
    await wait_workers(fe, 2, mockers=[language, encoder])
    async with client(fe) as c:
        yield fe, c, encoder


async def test_image_chat_goes_through_the_encode_worker_and_a_repeated_image_hits_its_cache(vlm):
    _fe, c, encoder = vlm
    text_only = await c.chat.completions.create(
        model=MODEL, messages=image_message("What is in this picture?"), max_tokens=4
    )
    image = data_url(png(64, 64))  # 3 x 3 merged 28-pixel patches: 9 image tokens
    first = await c.chat.completions.create(
        model=MODEL,
        messages=image_message("What is in this picture?", image),
        max_tokens=6,
        extra_body={"ignore_eos": True},
    )
    assert first.choices[0].message.content and first.choices[0].finish_reason == "length"
    assert first.usage.prompt_tokens == text_only.usage.prompt_tokens + 9
    metrics = encoder.metrics()
    assert metric(metrics, "dynamo_encode_cache_misses_total") == 1
    assert metric(metrics, "dynamo_encode_cache_hits_total") == 0

    again = await c.chat.completions.create(
        model=MODEL, messages=image_message("What is in this picture?", image), max_tokens=6, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = [chunk async for chunk in again]
    usage = chunks[-1].usage
    assert usage.prompt_tokens == first.usage.prompt_tokens
    assert usage.prompt_tokens_details.cached_tokens >= 9  # the image's KV blocks are reused too
    metrics = encoder.metrics()
    assert metric(metrics, "dynamo_encode_cache_hits_total") == 1
    assert metric(metrics, "dynamo_encode_cache_misses_total") == 1


async def test_several_images_in_one_message_each_take_their_tokens(vlm):
    _fe, c, encoder = vlm
    one = await c.chat.completions.create(
        model=MODEL, messages=image_message("Compare", data_url(png(64, 64, 1))), max_tokens=2
    )
    two = await c.chat.completions.create(
        model=MODEL,
        messages=image_message("Compare", data_url(png(64, 64, 2)), data_url(png(56, 112, 3))),
        max_tokens=2,
    )
    assert two.usage.prompt_tokens == one.usage.prompt_tokens + 2 * 4  # 56x112: 2 x 4 patches
    assert metric(encoder.metrics(), "dynamo_encode_cache_misses_total") == 3


async def test_images_are_fetched_from_http_urls_with_bounds(vlm, image_server):
    _fe, c, _ = vlm
    base = await image_server({"/cat.png": png(64, 64, 9), "/big.png": noisy_png(200, 200)})
    ok = await c.chat.completions.create(
        model=MODEL, messages=image_message("Describe", base + "/cat.png"), max_tokens=2
    )
    assert ok.choices[0].message.content is not None
    cases = {
        "/big.png": ("image_too_large", "--max-image-bytes"),
        "/missing.png": ("image_fetch_failed", "HTTP 404"),
        "/slow.png": ("image_fetch_timeout", "took longer than 2s"),
        "/loop": ("image_fetch_failed", "redirected more than 3 times"),
    }
    for path, (code, words) in cases.items():
        with pytest.raises(openai.BadRequestError) as e:
            await c.chat.completions.create(
                model=MODEL, messages=image_message("x", base + path), max_tokens=2
            )
        assert e.value.code == code and words in e.value.message, (path, e.value.message)
        assert e.value.param == "messages[0].content[1].image_url"


async def test_bad_images_are_refused_with_400_naming_the_part(vlm):
    _fe, c, _ = vlm
    corrupt = bytearray(png(32, 32))
    corrupt[40] ^= 0xFF  # inside the IDAT chunk: its CRC no longer matches
    cases = [
        (data_url(b"this is not an image"), "invalid_image", "not a PNG, JPEG, GIF or WebP"),
        (data_url(bytes(corrupt)), "invalid_image", "bad CRC"),
        ("data:image/png;base64,@@@", "invalid_image_url", "not valid base64"),
        ("ftp://example.com/a.png", "invalid_image_url", "data: URL or an http(s) URL"),
        (data_url(noisy_png(200, 200)), "image_too_large", "65536 bytes"),
    ]
    for url, code, words in cases:
        with pytest.raises(openai.BadRequestError) as e:
            await c.chat.completions.create(
                model=MODEL, messages=image_message("look", data_url(png(8, 8)), url), max_tokens=2
            )
        assert e.value.code == code and words in e.value.message, e.value.message
        assert e.value.param == "messages[0].content[2].image_url", url[:40]
    with pytest.raises(openai.BadRequestError) as e:
        await c.chat.completions.create(
            model=MODEL,
            messages=[
                {
                    "role": "system",
                    "content": [{"type": "image_url", "image_url": {"url": data_url(png(8, 8))}}],
                }
            ],
        )
    assert "only allowed in 'user' messages" in e.value.message


async def test_private_image_urls_are_refused_unless_allowed(
    mockers, frontend_factory, wait_workers, image_server
):
    language, encoder = mockers("null"), mockers("null", "--role", "encode", component="encoder")
    fe = await frontend_factory()  # default: private addresses refused
    await wait_workers(fe, 2, mockers=[language, encoder])
    base = await image_server({"/cat.png": png(16, 16)})
    async with client(fe) as c:
        for url in (
            base + "/cat.png",
            base.replace("127.0.0.1", "localhost") + "/cat.png",
            "http://[::1]/a.png",
        ):
            with pytest.raises(openai.BadRequestError) as e:
                await c.chat.completions.create(model=MODEL, messages=image_message("x", url), max_tokens=2)
            assert e.value.code == "image_url_not_allowed", e.value.message
            assert "--allow-private-image-urls" in e.value.message


async def test_image_chat_without_an_encode_worker_is_503_naming_the_fix(
    mockers, frontend_factory, wait_workers
):
    language = mockers("null")
    fe = await frontend_factory()
    await wait_workers(fe, 1, mockers=[language])
    async with client(fe) as c:
        with pytest.raises(openai.InternalServerError) as e:
            await c.chat.completions.create(
                model=MODEL, messages=image_message("x", data_url(png(8, 8))), max_tokens=2
            )
    assert e.value.status_code == 503 and "--role encode" in e.value.message


async def test_disaggregated_image_chat(mockers, frontend_factory, wait_workers):
    workers = [
        mockers("prefill"),
        mockers("decode"),
        mockers("null", "--role", "encode", component="encoder"),
    ]
    fe = await frontend_factory()
    await wait_workers(fe, 3, mockers=workers)
    async with client(fe) as c:
        r = await c.chat.completions.create(
            model=MODEL,
            messages=image_message("What is this?", data_url(png(64, 64, 5))),
            max_tokens=5,
            extra_body={"ignore_eos": True},
        )
    assert r.choices[0].message.content and r.usage.completion_tokens == 5


async def test_image_generation_returns_the_requested_count_and_format(
    mockers, frontend_factory, tmp_path: Path
):
    out = tmp_path / "images"
    diffusion = mockers(
        "null", "--role", "diffusion", "--media-output-fs-url", out.as_uri(), component="diffusion"
    )
    fe = await frontend_factory()

    def served() -> bool:
        assert diffusion.proc.poll() is None, diffusion.log()
        return MODEL in fe.registry.served()

    # no tokenizer to load: served as soon as discovery shows the worker
    await wait_until_async(served, "the diffusion model to be served", timeout_s=60, interval_s=0.1)
    async with client(fe) as c:
        assert MODEL in [m.id for m in (await c.models.list()).data]
        b64 = await c.images.generate(
            model=MODEL, prompt="a red fox", n=3, size="64x96", response_format="b64_json"
        )
        assert len(b64.data) == 3
        files = [base64.b64decode(d.b64_json) for d in b64.data]
        assert {(sniff(f).format, sniff(f).width, sniff(f).height) for f in files} == {("png", 64, 96)}
        assert len(set(files)) == 3  # each image of n is its own

        urls = await c.images.generate(model=MODEL, prompt="a red fox", n=2, size="64x64")
        assert len(urls.data) == 2 and all(d.url and d.url.startswith(out.as_uri()) for d in urls.data)
        assert sorted(p.name for p in out.iterdir()) == sorted(Path(d.url).name for d in urls.data)

        with pytest.raises(openai.BadRequestError) as e:
            await c.images.generate(model=MODEL, prompt="x", size="10x10")
        assert e.value.param == "size"
        with pytest.raises(openai.BadRequestError) as e:
            await c.images.generate(model=MODEL, prompt="x", n=11)
        assert e.value.param == "n"
        with pytest.raises(openai.BadRequestError) as e:
            await c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert "/v1/images/generations" in e.value.message
    worker = fe.registry.get(MODEL).by_role("diffusion")[0]
    async with aiohttp.ClientSession() as http, http.get(f"http://{worker.address}/health") as r:
        health = await r.json()
    assert r.status == 200 and health["role"] == "diffusion" and health["images_generated"] == 5


async def test_kv_router_sends_a_repeated_image_to_the_worker_that_caches_it(
    mockers, frontend_factory, wait_workers
):
    workers = [mockers("null", speedup=100.0) for _ in range(3)]
    workers.append(mockers("null", "--role", "encode", component="encoder"))
    fe = await frontend_factory(router_mode="kv")
    await wait_workers(fe, 4, mockers=workers)
    index = fe.router.index

    def image_first(url: str, text: str) -> list[dict]:
        return [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}],
            }
        ]

    cat, dog = data_url(png(224, 224, 1)), data_url(png(224, 224, 2))  # 8 x 8 = 64 image tokens each
    async with client(fe) as c:
        first = await c.chat.completions.create(
            model=MODEL, messages=image_first(cat, "What animal?"), max_tokens=2
        )
        await wait_until_async(
            lambda: max(index.block_count(w) for w in index.workers()) >= first.usage.prompt_tokens // 4,
            "the first request's KV events to reach the router",
            timeout_s=10,
            interval_s=0.01,
        )
        same = await c.chat.completions.create(
            model=MODEL, messages=image_first(cat, "Which colour is it, and how old?"), max_tokens=2
        )
        other = await c.chat.completions.create(
            model=MODEL, messages=image_first(dog, "Which colour is it, and how old?"), max_tokens=2
        )
    assert (
        same.usage.prompt_tokens_details.cached_tokens >= 64
    )  # the image's blocks, on the worker holding them
    assert (
        other.usage.prompt_tokens_details.cached_tokens < 64
    )  # another image: other pad ids, no shared blocks


# --- an image chat is served or refused as the same chat without the image -----------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PERSON = {
    "type": "json_schema",
    "json_schema": {
        "name": "person",
        "schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
            "required": ["name", "age"],
        },
    },
}
# ChatML that also shows an assistant's reasoning and tool calls and a tool result's call id.
TOOL_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m.role + '\\n' -}}"
    "{%- if m.reasoning_content -%}{{- '<think>' + m.reasoning_content + '</think>' -}}{%- endif -%}"
    "{{- m.content -}}"
    "{%- for c in m.tool_calls or [] -%}"
    "{{- '<tool_call>' + ({'name': c.function.name, 'arguments': c.function.arguments} | tojson) -}}"
    "{{- '</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- if m.tool_call_id -%}{{- ' id=' + m.tool_call_id -}}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
HISTORY = [
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "Paris weather needed.",
        "tool_calls": [
            {
                "id": "call_7",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_7", "content": "18 degrees, sunny"},
    {"role": "user", "content": "And in words?"},
]
# What the worker sees only when the history reached the template whole; the mocker then answers SEEN.
RENDERED_HISTORY = (
    '<|im_start|>assistant\n<think>Paris weather needed.</think><tool_call>{"name": "get_weather", '
    '"arguments": {"city": "Paris"}}</tool_call><|im_end|>\n<|im_start|>tool\n18 degrees, sunny id=call_7'
    "<|im_end|>\n"
)
SEEN = "The whole history reached the worker."
SEEN_REPLY = "<think>It did.</think>" + SEEN  # with --reasoning-parser qwen3: reasoning, then content


def without_images(messages: list[dict]) -> list[dict]:
    return [
        m | {"content": [p for p in m["content"] if p["type"] == "text"]}
        if isinstance(m["content"], list)
        else m
        for m in messages
    ]


@pytest.fixture
def tool_model(tiny_model, tmp_path) -> Path:
    """The tiny model with ``TOOL_TEMPLATE`` as its chat template (published in its model card)."""
    model = tmp_path / "tool-model"
    model.mkdir()
    for f in tiny_model.iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    (model / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    return model


@pytest.fixture
def vlm_with(mockers, frontend_factory, wait_workers, namespace, tool_model, tmp_path):
    """``await vlm_with(*flags)``: in a namespace of its own, a language worker started with ``flags``
    (and a script that answers ``SEEN`` to a prompt showing ``RENDERED_HISTORY``), an encode worker and
    a frontend; its client."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"match": RENDERED_HISTORY, "reply": SEEN_REPLY}]))
    stacks = iter(range(100))

    async def start(*flags: str) -> openai.AsyncOpenAI:
        own = ("--model-path", str(tool_model), "--namespace", f"{namespace}-{next(stacks)}")
        language = mockers("null", *own, "--script", str(script), *flags)
        encoder = mockers("null", *own, "--role", "encode", component="encoder")
        fe = await frontend_factory(namespace=own[-1])
        await wait_workers(fe, 2, mockers=[language, encoder])
        return client(fe)

    return start


async def chat_both(c: openai.AsyncOpenAI, messages: list[dict], **kw) -> list:
    """The same chat without and with its image, each whole and streamed (folded into one message)."""
    answers = []
    for msgs in (without_images(messages), messages):
        answers.append(await c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=100, **kw))
        chunks = [
            chunk
            async for chunk in await c.chat.completions.create(
                model=MODEL, messages=msgs, max_tokens=100, stream=True, **kw
            )
        ]
        answers.append(fold(chunks))
    return answers


def fold(chunks: list) -> dict:
    content, reasoning, calls, logprobs, finish = "", "", {}, [], None
    for chunk in chunks:
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        reasoning += getattr(choice.delta, "reasoning_content", None) or ""
        for tc in choice.delta.tool_calls or []:
            call = calls.setdefault(tc.index, {"name": tc.function.name, "arguments": ""})
            call["arguments"] += tc.function.arguments or ""
        logprobs += choice.logprobs.content if choice.logprobs and choice.logprobs.content else []
        finish = choice.finish_reason or finish
    return {
        "content": content,
        "reasoning": reasoning,
        "calls": list(calls.values()),
        "logprobs": logprobs,
        "finish": finish,
    }


def whole_answer(r) -> dict:
    m = r.choices[0].message
    calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in m.tool_calls or []]
    lp = r.choices[0].logprobs.content if r.choices[0].logprobs else []
    return {
        "content": m.content,
        "reasoning": getattr(m, "reasoning_content", None) or "",
        "calls": calls,
        "logprobs": lp or [],
        "finish": r.choices[0].finish_reason,
    }


def answers(raw: list) -> list[dict]:
    return [a if isinstance(a, dict) else whole_answer(a) for a in raw]


async def refusal(c: openai.AsyncOpenAI, messages: list[dict], **kw) -> dict:
    with pytest.raises(openai.BadRequestError) as e:
        await c.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, **kw)
    return e.value.body


async def test_image_chat_with_a_json_schema_is_constrained_or_refused_as_text_is(vlm_with):
    image = image_message("Who is this?", data_url(png(64, 64, 7)))
    async with await vlm_with("--grammar-backend", "none") as c:
        text_refusal = await refusal(c, without_images(image), response_format=PERSON)
        assert (
            text_refusal["code"] == "grammar_backend_disabled" and text_refusal["param"] == "response_format"
        )
        assert await refusal(c, image, response_format=PERSON) == text_refusal
    async with await vlm_with() as c:
        for a in answers(await chat_both(c, image, response_format=PERSON)):
            person = json.loads(a["content"])
            assert isinstance(person["name"], str) and person["age"] >= 0, a


async def test_image_chat_with_a_required_tool_calls_it_or_is_refused_as_text_is(vlm_with):
    image = image_message("Weather here?", data_url(png(64, 64, 8)))
    async with await vlm_with("--grammar-backend", "none") as c:
        text_refusal = await refusal(c, without_images(image), tools=[WEATHER], tool_choice="required")
        assert text_refusal["code"] == "grammar_backend_disabled" and text_refusal["param"] == "tool_choice"
        assert await refusal(c, image, tools=[WEATHER], tool_choice="required") == text_refusal
    async with await vlm_with() as c:
        for a in answers(await chat_both(c, image, tools=[WEATHER], tool_choice="required")):
            assert a["finish"] == "tool_calls" and a["calls"], a
            assert all(
                call["name"] == "get_weather" and "city" in json.loads(call["arguments"])
                for call in a["calls"]
            )


async def test_image_chat_with_logprobs_returns_them_as_text_does(vlm_with):
    image = image_message("Describe it", data_url(png(64, 64, 9)))
    async with await vlm_with() as c:
        for a in answers(await chat_both(c, image, logprobs=True, top_logprobs=2)):
            assert a["logprobs"] and "".join(e.token for e in a["logprobs"]) == a["content"], a
            assert all(len(e.top_logprobs) == 2 for e in a["logprobs"])


async def test_image_chat_keeps_the_tool_calls_results_and_reasoning_of_its_history(vlm_with):
    """The worker answers ``SEEN_REPLY`` only to token ids that decode to ``RENDERED_HISTORY``: the
    assistant's reasoning and tool call and the tool result's call id, as the chat template shows them.
    Its reasoning parser splits the reply for the image chat as for the text one."""
    image = image_message("What is the weather where this photo was taken?", data_url(png(64, 64, 10)))
    async with await vlm_with("--reasoning-parser", "qwen3") as c:
        for a in answers(await chat_both(c, image + HISTORY)):
            assert (a["reasoning"], a["content"]) == ("It did.", SEEN), a
