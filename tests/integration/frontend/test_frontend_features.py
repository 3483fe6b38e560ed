"""Tools, reasoning, structured output and logprobs through the real stack: the official ``openai``
client against our frontend process, mocker worker processes over the real request plane and a real
nats-server. Each model family's worker runs its SGLang ``--tool-call-parser`` / ``--reasoning-parser``
and replies with golden text in that family's format (``features_stack``); the tests check what a
client sees, streamed and not."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI

from tests.integration.frontend.features_stack import FAMILIES, Stack, prompt, start_stack, stop_stack

pytestmark = pytest.mark.integration

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"type": "string"}},
                "required": ["tz"],
            },
        },
    },
]
PARSERS = list(FAMILIES)


@pytest.fixture(scope="module")
def stack(nats_server, tiny_model, tmp_path_factory) -> Iterator[Stack]:
    s = start_stack(nats_server.url, tiny_model, tmp_path_factory.mktemp("features"))
    yield s
    stop_stack(s)


@pytest.fixture(scope="module")
def client(stack) -> Iterator[OpenAI]:
    with OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0, timeout=30) as c:
        yield c


def post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def chat(client: OpenAI, model: str, keyword: str, **kw):
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt(model, keyword)}],
        max_tokens=600,
        **kw,
    )


def streamed(client: OpenAI, model: str, keyword: str, **kw) -> dict:
    """The stream folded into one message, checking the chunk shapes on the way."""
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in chat(client, model, keyword, stream=True, **kw):
        assert chunk.object == "chat.completion.chunk"
        choice = chunk.choices[0]
        delta = choice.delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            if tc.index not in calls:  # the first delta of a call names it
                assert tc.id and tc.id.startswith("call_") and tc.type == "function" and tc.function.name
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = choice.finish_reason or finish
    return {
        "reasoning": reasoning,
        "content": content,
        "calls": [calls[i] for i in sorted(calls)],
        "finish": finish,
    }


@pytest.mark.parametrize("model", PARSERS)
def test_one_tool_call_per_parser_whole_and_streamed(client, model):
    whole = chat(client, model, "one call", tools=TOOLS)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert not choice.message.content
    s = streamed(client, model, "one call", tools=TOOLS)
    assert s["finish"] == "tool_calls" and s["content"] == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in s["calls"]] == [
        ("get_weather", {"city": "Paris"})
    ]


@pytest.mark.parametrize("model", PARSERS)
def test_parallel_tool_calls_per_parser(client, model):
    cities = [{"city": "Paris"}, {"city": "Tokyo"}]
    whole = chat(client, model, "two calls", tools=TOOLS)
    calls = whole.choices[0].message.tool_calls
    assert [json.loads(c.function.arguments) for c in calls] == cities
    assert len({c.id for c in calls}) == 2
    s = streamed(client, model, "two calls", tools=TOOLS)
    assert [json.loads(c["arguments"]) for c in s["calls"]] == cities
    assert s["finish"] == "tool_calls"
    only_first = chat(client, model, "two calls", tools=TOOLS, parallel_tool_calls=False)
    assert [json.loads(c.function.arguments) for c in only_first.choices[0].message.tool_calls] == cities[:1]


def test_text_before_a_call_is_content_and_never_holds_the_markup(client):
    whole = chat(client, "qwen", "two calls", tools=TOOLS)
    assert whole.choices[0].message.content == "Let me check both."
    s = streamed(client, "qwen", "two calls", tools=TOOLS)
    assert s["content"] == "Let me check both."


def test_without_tools_the_reply_is_plain_text(client):
    whole = chat(client, "qwen", "one call")
    assert whole.choices[0].finish_reason == "stop"
    assert "<tool_call>" in whole.choices[0].message.content
    assert whole.choices[0].message.tool_calls is None
    none = chat(client, "qwen", "one call", tools=TOOLS, tool_choice="none")
    assert none.choices[0].message.tool_calls is None and "<tool_call>" in none.choices[0].message.content


@pytest.mark.parametrize(
    ("model", "reasoning", "content"),
    [
        ("qwen", "The user asks for the capital of France. It is Paris.", "Paris."),
        ("deepseekv3", "The capital of France is Paris.", "Paris."),
        ("gpt-oss", "The capital of France is Paris.", "Paris."),
    ],
)
def test_reasoning_is_split_from_content_whole_and_streamed(client, model, reasoning, content):
    whole = chat(client, model, "think")
    message = whole.choices[0].message
    assert message.reasoning_content == reasoning and message.content == content
    s = streamed(client, model, "think")
    assert (s["reasoning"], s["content"]) == (reasoning, content)
    raw = chat(client, model, "think", extra_body={"separate_reasoning": False})
    assert reasoning in raw.choices[0].message.content


def test_reasoning_and_a_tool_call_together(client):
    for model in ("deepseekv3", "gpt-oss"):
        s = streamed(client, model, "one call", tools=TOOLS)
        assert s["reasoning"] and s["calls"][0]["name"] == "get_weather", (model, s)


def test_tool_choice_required_returns_calls_of_offered_tools(client):
    for stream in (False, True):
        if stream:
            s = streamed(client, "qwen", "no script", tools=TOOLS, tool_choice="required")
            calls = [(c["name"], json.loads(c["arguments"])) for c in s["calls"]]
            finish = s["finish"]
        else:
            r = chat(client, "qwen", "no script", tools=TOOLS, tool_choice="required")
            calls = [
                (c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls
            ]
            finish = r.choices[0].finish_reason
        assert finish == "tool_calls" and calls
        for name, args in calls:
            tool = next(t["function"] for t in TOOLS if t["function"]["name"] == name)
            assert set(tool["parameters"]["required"]) <= set(args)


def test_named_tool_choice_calls_that_function(client):
    r = chat(
        client,
        "llama3",
        "no script",
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "get_time" and isinstance(json.loads(call.function.arguments)["tz"], str)


def test_response_format_json_schema_and_json_object_reach_the_grammar(client):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
    }
    for stream in (False, True):
        kw = {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}}
        if stream:
            text = streamed(client, "qwen", "no script", **kw)["content"]
        else:
            text = chat(client, "qwen", "no script", **kw).choices[0].message.content
        value = json.loads(text)
        assert isinstance(value["name"], str) and 0 <= value["age"] <= 120
    obj = chat(client, "llama3", "no script", response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content), dict)


def test_regex_and_ebnf_are_passed_to_the_worker(client):
    # The mocker simulates JSON schemas only: its refusal quotes the grammar it received.
    for field, grammar in (("regex", "(yes|no)"), ("ebnf", 'root ::= "yes" | "no"')):
        with pytest.raises(openai.BadRequestError) as e:
            chat(client, "qwen", "no script", extra_body={field: grammar})
        assert grammar in str(e.value) and field in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="qwen", prompt="x", max_tokens=4, extra_body={"regex": "[0-9]+"})
    assert "[0-9]+" in str(e.value)
    tag = {
        "type": "structural_tag",
        "structures": [{"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}],
        "triggers": ["<f>"],
    }
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, "qwen", "no script", response_format=tag)
    assert "structural_tag" in str(e.value) and "triggers" in str(e.value)


def test_structured_output_on_a_worker_without_grammar_backend_is_a_clear_400(client):
    for kw, param in (
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
        ({"extra_body": {"regex": "a+"}}, "regex"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            chat(client, "nogrammar", "x", **kw)
        body = e.value.body
        assert body["param"] == param and body["code"] == "grammar_backend_disabled", body
        assert "--grammar-backend" in body["message"]


def test_tools_for_a_model_without_tool_parser_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, "nogrammar", "x", tools=TOOLS)
    assert e.value.body["param"] == "tools" and "--tool-call-parser" in e.value.body["message"]


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}]},
            "tools[0].function.parameters",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": 3}}},
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"required": "a"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"response_format": {"type": "structural_tag", "triggers": ["<f>"]}}, "response_format"),
        ({"response_format": {"type": "json_object"}, "regex": "a"}, "regex"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 50}, "top_logprobs"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {}}]}]},
            "messages[0].tool_calls[0].function.name",
        ),
    ],
)
def test_malformed_tools_schemas_and_options_are_400_naming_the_field(stack, patch, param):
    body = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4} | patch
    status, answer = post(stack.url + "/v1/chat/completions", body)
    assert status == 400, answer
    err = answer["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert err["message"]


def test_completions_json_schema_text_is_checked(stack):
    status, answer = post(
        stack.url + "/v1/completions",
        {"model": "qwen", "prompt": "x", "json_schema": "{not json", "max_tokens": 4},
    )
    assert status == 400 and answer["error"]["param"] == "json_schema"


def test_chat_logprobs_cover_every_token_with_alternatives(client):
    for stream in (False, True):
        kw = {"logprobs": True, "top_logprobs": 3, "max_tokens": 12}
        if stream:
            entries, text = [], ""
            for chunk in client.chat.completions.create(
                model="llama3", messages=[{"role": "user", "content": "count"}], stream=True, **kw
            ):
                c = chunk.choices[0]
                text += c.delta.content or ""
                entries += c.logprobs.content if c.logprobs and c.logprobs.content else []
        else:
            r = client.chat.completions.create(
                model="llama3", messages=[{"role": "user", "content": "count"}], **kw
            )
            text, entries = r.choices[0].message.content, r.choices[0].logprobs.content
            assert r.usage.completion_tokens == len(entries)
        assert len(entries) == 12 and "".join(e.token for e in entries) == text
        for e in entries:
            assert e.logprob <= 0 and len(e.top_logprobs) == 3
            assert e.top_logprobs[0].token == e.token and e.bytes == list(e.token.encode())


def test_completion_logprobs_have_openai_legacy_shape(client):
    r = client.completions.create(model="llama3", prompt="count", max_tokens=6, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0


def test_tool_messages_reach_the_worker_as_a_conversation(client):
    messages = [
        {"role": "user", "content": prompt("qwen", "one call")},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ]
    r = client.chat.completions.create(model="qwen", messages=messages, tools=TOOLS, max_tokens=600)
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert r.usage.prompt_tokens > 10


def test_reasoning_effort_is_accepted(client):
    r = chat(client, "gpt-oss", "think", reasoning_effort="low")
    assert r.choices[0].message.content == "Paris."


def test_whole_answers_name_only_known_fields(stack):
    body = {
        "model": "qwen",
        "messages": [{"role": "user", "content": prompt("qwen", "think")}],
        "max_tokens": 200,
    }
    _, answer = post(stack.url + "/v1/chat/completions", body)
    message = answer["choices"][0]["message"]
    assert set(message) <= {"role", "content", "reasoning_content", "tool_calls"}
    assert not re.search(r"</?think>", message["content"])
