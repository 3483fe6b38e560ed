"""A frontend with API keys, driven by the official ``openai`` client over real HTTP (a mocker worker,
nats-server): the right key (the flag's, or any line of the key file) serves chat, streamed chat,
completions and /v1/models; a wrong key and no key are 401 in OpenAI's error shape, quoting no key;
/health, /live and /metrics stay open; the refusals are counted, and no key reaches the log."""

from __future__ import annotations

import asyncio
import logging
import urllib.error
import urllib.request

import openai
import pytest

from tests.integration.frontend.conftest import MODEL

pytestmark = pytest.mark.integration

KEY = "sk-soak-7f3a9c0e5d"
ROTATED = "sk-rotated-1b2c3d"
WRONG = "sk-wrong-000111"
MESSAGES = [{"role": "user", "content": "Hello!"}]


def client(fe, api_key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fe.url + "/v1", api_key=api_key, max_retries=0, timeout=30)


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """GET ``url`` with a plain HTTP client (off the event loop, which serves the frontend)."""

    def fetch() -> tuple[int, str]:
        request = urllib.request.Request(url, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    return await asyncio.to_thread(fetch)


@pytest.fixture
async def keyed(mockers, frontend_factory, wait_workers, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"# one key a line\n{ROTATED}\n")
    m = mockers("null")
    fe = await frontend_factory(api_key=KEY, api_key_file=keys)
    await wait_workers(fe, 1, mockers=[m])
    return fe


async def test_right_key_serves(keyed):
    async with client(keyed, KEY) as c:
        r = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
        assert r.choices[0].finish_reason == "length"
        stream = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, stream=True)
        finishes = [ch.choices[0].finish_reason async for ch in stream if ch.choices]
        assert finishes[-1] == "length"
        assert [m.id async for m in c.models.list()] == [MODEL]
    async with client(keyed, ROTATED) as c:  # a key of the file
        r2 = await c.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert r2.choices[0].finish_reason == "length"


async def test_wrong_key_and_no_key_are_401_in_openais_shape(keyed, caplog):
    caplog.set_level(logging.DEBUG)
    async with client(keyed, WRONG) as c:
        with pytest.raises(openai.AuthenticationError) as wrong:
            await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
        with pytest.raises(openai.AuthenticationError):
            await c.models.list()
    assert wrong.value.status_code == 401
    assert wrong.value.body["type"] == "invalid_request_error"
    assert wrong.value.body["code"] == "invalid_api_key" and wrong.value.code == "invalid_api_key"
    assert wrong.value.response.headers["www-authenticate"] == "Bearer"
    # no key at all: the openai client always sends one, so the header is left out of this request
    async with client(keyed, "unused") as c:
        with pytest.raises(openai.AuthenticationError) as missing:
            await c.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                max_tokens=3,
                extra_headers={"Authorization": openai.Omit()},
            )
    assert missing.value.status_code == 401
    assert missing.value.body["code"] is None and "didn't provide an API key" in missing.value.message
    for e in (wrong.value, missing.value):
        assert set(e.body) == {"message", "type", "param", "code"}
        assert KEY not in e.response.text and WRONG not in e.response.text
    status, metrics = await get(keyed.url + "/metrics")
    assert status == 200 and 'dynamo_frontend_errors_total{type="invalid_api_key"} 3.0' in metrics
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("dynamo_worker"))
    assert KEY not in logged and WRONG not in logged and ROTATED not in logged


async def test_health_live_and_metrics_stay_open(keyed):
    for path in ("/health", "/live", "/metrics"):
        assert (await get(keyed.url + path))[0] == 200, path
    for path in ("/v1/models", f"/v1/models/{MODEL}", "/v1/unknown"):
        assert (await get(keyed.url + path))[0] == 401, path
    assert (await get(keyed.url + "/v1/models", {"Authorization": f"Bearer {KEY}"}))[0] == 200
