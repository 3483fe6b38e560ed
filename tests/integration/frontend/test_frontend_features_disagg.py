"""The request features in disaggregated serving: a prefill and a decode mocker worker (real request
plane, real bootstrap rendezvous, real nats-server) answer a scripted Qwen tool call, a JSON schema
request and a logprobs request through the frontend exactly as an aggregated worker does."""

from __future__ import annotations

import json

import pytest
from openai import AsyncOpenAI

from tests.integration.frontend.conftest import MODEL
from tests.integration.frontend.features_stack import FAMILIES, prompt

pytestmark = pytest.mark.integration

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


async def test_tool_call_json_schema_and_logprobs_disaggregated(
    mockers, frontend_factory, wait_workers, tmp_path
):
    reply = FAMILIES["qwen"][1]["two calls"]
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"match": prompt("qwen", "two calls"), "reply": reply}]))
    flags = ("--tool-call-parser", "qwen25", "--script", str(script))
    workers = [mockers("prefill", *flags, speedup=1000.0), mockers("decode", *flags, speedup=1000.0)]
    fe = await frontend_factory()
    await wait_workers(fe, 2, mockers=workers)
    async with AsyncOpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
        messages = [{"role": "user", "content": prompt("qwen", "two calls")}]
        r = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=400)
        calls = r.choices[0].message.tool_calls
        assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris", "Tokyo"]
        assert (
            r.choices[0].message.content == "Let me check both."
            and r.choices[0].finish_reason == "tool_calls"
        )
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
        j = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "n?"}], response_format=fmt, max_tokens=50
        )
        assert isinstance(json.loads(j.choices[0].message.content)["n"], int)
        lp = await client.completions.create(model=MODEL, prompt="count", max_tokens=5, logprobs=1)
        assert (
            len(lp.choices[0].logprobs.tokens) == 5
            and "".join(lp.choices[0].logprobs.tokens) == lp.choices[0].text
        )
