"""Fuzzing the OpenAI request models with hypothesis: any JSON body (and near-valid bodies with one
field replaced by arbitrary JSON) either parses or raises ``InvalidRequest`` with an OpenAI-shaped body;
nothing else escapes. Bounded example counts keep it well under a few seconds."""

from __future__ import annotations

import json

from dynamo_worker.frontend.errors import InvalidRequest
from dynamo_worker.frontend.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    parse_request,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)

CHAT_FIELDS = [
    "model",
    "messages",
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
    "logprobs",
    "min_p",
    "min_tokens",
    "frequency_penalty",
    "presence_penalty",
    "tools",
    "user",
]
COMPLETION_FIELDS = ["model", "prompt", "max_tokens", "stop", "echo", "best_of", "suffix", "stream", "n"]
VALID_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
VALID_COMPLETION = {"model": "m", "prompt": "hi"}


def check(model, body: bytes) -> None:
    try:
        parse_request(model, body)
    except InvalidRequest as e:
        err = e.body()["error"]
        assert err["type"] == "invalid_request_error" and err["message"]
        assert err["param"] is None or isinstance(err["param"], str)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_arbitrary_json_never_escapes(value):
    body = json.dumps(value).encode()
    check(ChatCompletionRequest, body)
    check(CompletionRequest, body)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CHAT_FIELDS), json_values)
def test_one_bad_chat_field_names_itself(field, value):
    body = {**VALID_CHAT, field: value}
    try:
        parse_request(ChatCompletionRequest, json.dumps(body).encode())
    except InvalidRequest as e:
        assert e.param is not None and e.param.split("[")[0].split(".")[0] == field


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(COMPLETION_FIELDS), json_values)
def test_one_bad_completion_field_names_itself(field, value):
    body = {**VALID_COMPLETION, field: value}
    try:
        parse_request(CompletionRequest, json.dumps(body).encode())
    except InvalidRequest as e:
        assert e.param is not None and e.param.split("[")[0].split(".")[0] == field


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_never_escape(raw):
    check(ChatCompletionRequest, raw)
