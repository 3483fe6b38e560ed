"""Fuzz pass over the new request fields: hypothesis builds chat, completion and embedding bodies with
one of the fields for tools, structured output, logprobs, reasoning and embeddings replaced by arbitrary
JSON (or by a near-valid value), and sends them over real HTTP to our frontend process with mocker
workers (a tool-calling and reasoning one, an embedding one). No answer may be a 5xx, and every error
has OpenAI's shape. (Hypothesis runs the blocking HTTP client; the stack runs in its own processes.)"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.frontend.features_stack import Stack, start_stack, stop_stack

pytestmark = pytest.mark.integration

CHAT = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
COMPLETION = {"model": "qwen", "prompt": "hi", "max_tokens": 8}
EMBED = {"model": "embed", "input": "hi"}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
CHAT_FIELDS = [
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "logprobs",
    "top_logprobs",
    "reasoning_effort",
    "chat_template_kwargs",
    "separate_reasoning",
    "regex",
    "ebnf",
    "messages",
]
COMPLETION_FIELDS = ["logprobs", "json_schema", "regex", "ebnf"]
EMBED_FIELDS = ["input", "encoding_format", "dimensions", "model"]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
schemas = st.recursive(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["string", "integer", "number", "boolean", "null", "strin"])}
    ),
    lambda inner: (
        st.fixed_dictionaries(
            {
                "type": st.just("object"),
                "properties": st.dictionaries(st.text(min_size=1, max_size=5), inner, max_size=3),
            }
        )
        | st.fixed_dictionaries({"type": st.just("array"), "items": inner})
        | st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=2)})
    ),
    max_leaves=6,
)
near_valid = {
    "tools": st.lists(
        st.fixed_dictionaries(
            {
                "type": st.just("function"),
                "function": st.fixed_dictionaries(
                    {"name": st.text(max_size=8), "parameters": schemas | json_values}
                ),
            }
        ),
        max_size=2,
    ),
    "tool_choice": st.sampled_from(
        ["none", "auto", "required", {"type": "function", "function": {"name": "f"}}]
    )
    | json_values,
    "response_format": st.fixed_dictionaries(
        {
            "type": st.sampled_from(["text", "json_object", "json_schema"]),
            "json_schema": st.fixed_dictionaries({"name": st.just("x"), "schema": schemas | json_values}),
        }
    ),
    "top_logprobs": st.integers(-2, 30),
    "dimensions": st.integers(-2, 100),
    "input": st.lists(st.integers(-5, 2000), max_size=4) | st.lists(st.text(max_size=5), max_size=3),
}


def _body(t: tuple[str, str, object]) -> tuple[str, dict]:
    path, name, value = t
    base = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETION, "/v1/embeddings": EMBED}[path]
    body = dict(base) | {name: value}
    if path == "/v1/chat/completions" and name in ("tool_choice", "parallel_tool_calls"):
        body["tools"] = [TOOL]
    if name == "top_logprobs":
        body["logprobs"] = True
    return path, body


def _field(path: str, names: list[str]) -> st.SearchStrategy:
    return st.sampled_from(names).flatmap(
        lambda n: st.tuples(st.just(path), st.just(n), near_valid.get(n, json_values) | json_values)
    )


bodies = st.one_of(
    _field("/v1/chat/completions", CHAT_FIELDS),
    _field("/v1/completions", COMPLETION_FIELDS),
    _field("/v1/embeddings", EMBED_FIELDS),
).map(_body)


def post(url: str, body: object) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="module")
def stack(nats_server, tiny_model, tmp_path_factory) -> Iterator[Stack]:
    s = start_stack(nats_server.url, tiny_model, tmp_path_factory.mktemp("fuzz"))
    yield s
    stop_stack(s)


def test_fuzz_new_fields_never_5xx(stack):
    sent, statuses = 0, set()

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(bodies)
    def check(case: tuple[str, dict]) -> None:
        nonlocal sent
        path, body = case
        status, content = post(stack.url + path, body)
        sent += 1
        statuses.add(status)
        assert status < 500, (status, content[:400], body)
        if status >= 400:
            err = json.loads(content)["error"]
            assert err["type"] and err["message"], err

    check()
    assert sent >= 100 and 200 in statuses and 400 in statuses
