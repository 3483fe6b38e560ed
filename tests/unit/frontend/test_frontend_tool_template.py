"""Tool definitions, earlier tool calls and tool results reach the chat template the way HF chat
templates expect them (``tools``, ``message.tool_calls[].function.arguments`` as a mapping,
``tool_call_id``), with a Hermes/Qwen-style template written for this test; ``reasoning_effort`` and
``chat_template_kwargs`` become template variables."""

from __future__ import annotations

import json

from dynamo_worker.frontend.models.preprocessor import Preprocessor
from dynamo_worker.frontend.protocol import ChatCompletionRequest, parse_request
from dynamo_worker.frontend.requests.chat import chat_messages, plan_chat
from dynamo_worker.protocol import ServingFeatures
from dynamo_worker.tinymodel import ensure_tiny_model
from tokenizers import Tokenizer

TEMPLATE = (
    "{%- if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>\n{% endif %}"
    "{%- if reasoning_effort %}effort={{ reasoning_effort }}\n{% endif %}"
    "{%- if enable_thinking is defined %}thinking={{ enable_thinking }}\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}"
    "{%- for c in m.tool_calls %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}</tool_call>{% endfor %}\n"
    "{%- elif m.role == 'tool' %}<tool_response id={{ m.tool_call_id }}>{{ m.content }}</tool_response>\n"
    "{%- else %}{{ m.role }}: {{ m.content }}\n{% endif %}"
    "{%- endfor %}"
)


def test_tools_calls_and_results_render_in_the_template(tmp_path):
    model = ensure_tiny_model(tmp_path / "m")
    pre = Preprocessor(
        Tokenizer.from_file(str(model / "tokenizer.json")),
        chat_template=TEMPLATE,
        special_tokens={},
        eos_token_ids=[2],
        context_length=4096,
    )
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "w", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        ],
        "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
        "reasoning_effort": "low",
        "chat_template_kwargs": {"enable_thinking": False},
    }
    req = parse_request(ChatCompletionRequest, json.dumps(body).encode())
    plan = plan_chat(req, ServingFeatures(tool_call_parser="hermes"))
    assert plan is not None
    text = pre.render_chat(chat_messages(req), True, plan.template_kwargs)
    assert text == (
        "<tools>w;</tools>\neffort=low\nthinking=False\nuser: Weather in Paris?\n"
        '<tool_call>{"name": "w", "arguments": {"city": "Paris"}}</tool_call>'  # trim_blocks eats the \n
        "<tool_response id=c1>18C</tool_response>"
    )
    none = parse_request(ChatCompletionRequest, json.dumps(body | {"tool_choice": "none"}).encode())
    plan = plan_chat(none, ServingFeatures(tool_call_parser="hermes"))
    assert plan is not None and "tools" not in plan.template_kwargs  # tool_choice none hides the tools


def test_a_template_choking_on_a_request_value_is_a_400(tmp_path):
    from dynamo_worker.frontend.errors import InvalidRequest

    model = ensure_tiny_model(tmp_path / "m")
    pre = Preprocessor(
        Tokenizer.from_file(str(model / "tokenizer.json")),
        chat_template="{{ extra + 1 }}",  # str + int: a TypeError inside the template
        special_tokens={},
        eos_token_ids=[2],
        context_length=4096,
    )
    try:
        pre.render_chat([{"role": "user", "content": "x"}], True, {"extra": "not a mapping"})
    except InvalidRequest as e:
        assert e.param == "messages" and e.code == "chat_template_error"
    else:
        raise AssertionError("expected a 400")
