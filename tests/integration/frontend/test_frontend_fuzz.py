"""API fuzz pass: hypothesis generates request bodies for both generation endpoints (valid ones with
one field replaced by arbitrary JSON, and arbitrary JSON) and sends them over real HTTP to a frontend
with a real mocker worker; no answer may be a 5xx, and every error has OpenAI's error shape. The
example count is bounded so the pass takes well under a minute. (Hypothesis runs in a thread with a
blocking HTTP client while the frontend serves on the test's event loop.)"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.integration

MODEL = "tiny"
PATHS = ["/v1/chat/completions", "/v1/completions"]
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
FIELDS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stop_token_ids",
    "n",
    "stream",
    "stream_options",
    "ignore_eos",
    "min_tokens",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "logprobs",
    "echo",
    "tools",
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _one_field(t: tuple[str, str, object]) -> tuple[str, object]:
    path, field, value = t
    body = dict(CHAT if "chat" in path else COMPLETION)
    body[field] = value
    if isinstance(value, int) and field in ("max_tokens", "max_completion_tokens", "min_tokens"):
        body[field] = min(value, 8)  # keep valid requests short
    return path, body


bodies = st.one_of(
    st.tuples(st.sampled_from(PATHS), st.sampled_from(FIELDS), json_values).map(_one_field),
    st.tuples(st.sampled_from(PATHS), json_values),
)


def post(url: str, body: object) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def fuzz(base_url: str) -> int:
    sent = 0

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(bodies)
    def check(case: tuple[str, object]) -> None:
        nonlocal sent
        path, body = case
        status, content = post(base_url + path, body)
        sent += 1
        assert status < 500, (status, content[:300], body)
        if status >= 400:
            err = json.loads(content)["error"]
            assert err["type"] and err["message"], err

    check()
    return sent


async def test_fuzz_http_endpoints_never_5xx(mockers, frontend_factory, wait_workers):
    m = mockers("null", speedup=1000.0)
    fe = await frontend_factory()
    await wait_workers(fe, 1, mockers=[m])
    sent = await asyncio.to_thread(fuzz, fe.url)
    assert sent >= 100
