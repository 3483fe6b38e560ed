"""Response shaping and job building, as pure functions: a plain stream's SSE events are byte for byte
the chunk models rendered whole (whatever the text or the model's name), bodies (errors too) keep
OpenAI's field order, tool calls, reasoning and logprobs are shaped by the same models, worker finish
reasons map to OpenAI's or to an error, /health says why it is unhealthy, and ``build_job`` refuses
prompts that are empty or do not fit, naming the field and the room left."""

from __future__ import annotations

import orjson
import pytest
from dynamo_worker.frontend.errors import InvalidRequest, ModelNotFound, UpstreamError
from dynamo_worker.frontend.models.preprocessor import Preprocessor
from dynamo_worker.frontend.models.registry import ModelEntry
from dynamo_worker.frontend.output.shaping import Head, StreamEvents, finish_reason, health, sse, usage, whole
from dynamo_worker.frontend.protocol import (
    AssistantMessage,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatLogprobs,
    ChatTokenLogprob,
    ChatToolCall,
    ChatToolCallDelta,
    ChatTopLogprob,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    FunctionCall,
    FunctionDelta,
    dump,
)
from dynamo_worker.frontend.requests.job import build_job

TEXTS = ["a", ' "quoted" \\ back', "line\nbreak", "\x00", "caf\u00e9 \U0001f600", "\u2028"]
# Names that would break a template cut at the text's mark, or at the choice's bytes.
MODELS = [
    "tiny",
    'a"b',
    "\x00",
    '{"index":0,"delta":{"content":"\\u0000"},"logprobs":null,"finish_reason":null}',
]


def _whole_chunk(head: Head, choice: ChatChunkChoice | CompletionChoice) -> bytes:
    """The event as built and dumped in full, model by model: what the fast path must equal."""
    cls = ChatCompletionChunk if head.kind == "chat" else Completion
    body = cls(id=head.id, created=head.created, model=head.model, choices=[choice])
    return sse(dump(body, exclude=None if head.include_usage else {"usage"}))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_stream_events_equal_the_chunk_models_rendered_whole(kind, include_usage, model):
    head = Head(kind, "chatcmpl-1", 1700000000, model, include_usage)
    events = StreamEvents(head)
    for text in TEXTS:
        if kind == "chat":
            choice: ChatChunkChoice | CompletionChoice = ChatChunkChoice(delta=ChatDelta(content=text))
            final = ChatChunkChoice(delta=ChatDelta(content=text), finish_reason="length")
        else:
            choice = CompletionChoice(text=text)
            final = CompletionChoice(text=text, finish_reason="length")
        assert events.text(text) == _whole_chunk(head, choice)
        assert events.final(text, "length") == _whole_chunk(head, final)
        assert orjson.loads(events.text(text)[6:])["model"] == model
    empty = ChatChunkChoice(delta=ChatDelta(), finish_reason="stop") if kind == "chat" else None
    assert events.final("", "stop") == _whole_chunk(
        head, empty or CompletionChoice(text="", finish_reason="stop")
    )
    if kind == "chat":
        role = ChatChunkChoice(delta=ChatDelta(role="assistant", content=""))
        assert events.role() == _whole_chunk(head, role)


def test_bodies_keep_openais_field_order():
    head = Head("chat", "chatcmpl-1", 7, "tiny", include_usage=True)
    events = StreamEvents(head)
    assert events.role() == (
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"tiny","choices":'
        b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
        b'"usage":null}\n\n'
    )
    assert events.usage(usage(5, 3, 2)) == (
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"tiny","choices":[],'
        b'"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,'
        b'"prompt_tokens_details":{"cached_tokens":2}}}\n\n'
    )
    plain = StreamEvents(Head("completion", "cmpl-1", 7, "tiny"))
    assert plain.text("hi") == (
        b'data: {"id":"cmpl-1","object":"text_completion","created":7,"model":"tiny","choices":'
        b'[{"index":0,"text":"hi","logprobs":null,"finish_reason":null}]}\n\n'
    )
    assert orjson.loads(dump(whole(head, "hello", "stop", usage(5, 3, 0)))) == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 7,
        "model": "tiny",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 5,
            "completion_tokens": 3,
            "total_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    }
    error = orjson.dumps(ModelNotFound("big", ["tiny"]).body())
    assert error.startswith(b'{"error":{"message":"The model \'big\' does not exist')
    assert error.endswith(b'"type":"invalid_request_error","param":"model","code":"model_not_found"}}')
    assert list(orjson.loads(dump(whole(head, "x", "stop", usage(1, 1, 0))))) == [
        "id", "object", "created", "model", "choices", "usage"
    ]  # fmt: skip


def test_events_with_features_keep_openais_shapes_and_field_order():
    """Tool-call deltas, reasoning and logprobs go through the same chunk models as plain text."""
    head = Head("chat", "chatcmpl-1", 7, "tiny")
    events = StreamEvents(head)
    call = ChatToolCallDelta(
        index=0, id="call_1", type="function", function=FunctionDelta(name="get_weather", arguments="")
    )
    top = ChatTopLogprob(token="a", logprob=-0.5, bytes=[97])
    lp = ChatLogprobs(content=[ChatTokenLogprob(token="a", logprob=-0.5, bytes=[97], top_logprobs=[top])])
    assert events.event(ChatDelta(tool_calls=[call]), lp) == (
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"tiny","choices":'
        b'[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":'
        b'{"name":"get_weather","arguments":""}}]},"logprobs":{"content":[{"token":"a","logprob":-0.5,'
        b'"bytes":[97],"top_logprobs":[{"token":"a","logprob":-0.5,"bytes":[97]}]}]},"finish_reason":null}]}'
        b"\n\n"
    )
    assert events.event(ChatDelta(reasoning_content="hm"), None, "stop") == _whole_chunk(
        head, ChatChunkChoice(delta=ChatDelta(reasoning_content="hm"), finish_reason="stop")
    )
    message = AssistantMessage(
        content=None,
        reasoning_content="hm",
        tool_calls=[ChatToolCall(id="call_1", function=FunctionCall(name="f", arguments="{}"))],
    )
    body = orjson.loads(dump(whole(head, "", "tool_calls", usage(1, 1, 0), message=message, logprobs=lp)))
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "hm",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    assert body["choices"][0]["logprobs"]["content"][0]["token"] == "a"
    plain = orjson.loads(dump(whole(head, "hi", "stop", usage(1, 1, 0))))
    assert plain["choices"][0]["message"] == {"role": "assistant", "content": "hi"}  # nothing else named
    completion = StreamEvents(Head("completion", "cmpl-1", 7, "tiny"))
    legacy = CompletionLogprobs(
        tokens=["a"], token_logprobs=[-0.5], top_logprobs=[{"a": -0.5}], text_offset=[0]
    )
    assert orjson.loads(completion.event("a", legacy)[6:])["choices"][0] == {
        "index": 0,
        "text": "a",
        "logprobs": {
            "tokens": ["a"],
            "token_logprobs": [-0.5],
            "top_logprobs": [{"a": -0.5}],
            "text_offset": [0],
        },
        "finish_reason": None,
    }


def test_worker_finish_reasons_map_to_openais_or_to_an_error():
    assert finish_reason("stop") == "stop" and finish_reason("length") == "length"
    with pytest.raises(UpstreamError) as e:
        finish_reason("cancelled")
    assert e.value.status == 502 and e.value.code == "worker_cancelled"
    assert "finish_reason=cancelled" in e.value.message


def test_health_is_503_with_the_reason_until_a_model_is_served():
    status, body = health([], "ns-a")
    assert status == 503 and body.status == "unhealthy" and "namespace 'ns-a'" in (body.reason or "")
    status, body = health(["tiny"], "ns-a")
    assert status == 200 and orjson.loads(dump(body)) == {"status": "healthy", "models": ["tiny"]}


def test_health_is_503_while_a_model_loads_its_first_card_and_says_so_before_the_pair_warm_ups():
    status, body = health(["tiny"], "ns-a", starting=["tiny"], loading=["tiny"])
    assert status == 503 and body.models == ["tiny"]
    assert body.reason == (
        "loading the model card (tokenizer, chat template) of tiny from its workers (bounded by "
        "--model-load-timeout-s)"
    )
    status, body = health(["tiny"], "ns-a", starting=["tiny"])
    assert status == 503 and "--pair-warmup-timeout-s" in (body.reason or "")


@pytest.fixture(scope="module")
def entry(model_dir) -> ModelEntry:
    return ModelEntry("tiny", preprocessor=Preprocessor.from_dir(model_dir))  # context length 256


def _chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]} | fields
    )


def test_build_job_fills_the_room_left_or_the_default(entry):
    job = build_job("chat", _chat(min_tokens=500), entry, [5] * 6, prompt_param="messages", default_max=None)
    assert job.id.startswith("chatcmpl-") and job.generate.stop.max_tokens == 250
    assert job.generate.stop.min_tokens == 250  # never more than the limit
    req = CompletionRequest.model_validate({"model": "tiny", "prompt": "hi", "stream": True, "stop": "x"})
    job = build_job("completion", req, entry, [5] * 6, prompt_param="prompt", default_max=16)
    assert job.id.startswith("cmpl-") and job.generate.stop.max_tokens == 16
    assert job.stream and job.stop_strings == ["x"] and job.generate.eos_token_ids == [1]


def test_build_job_refuses_what_does_not_fit_naming_the_field(entry):
    with pytest.raises(InvalidRequest) as e:
        build_job("chat", _chat(), entry, [], prompt_param="messages", default_max=None)
    assert (e.value.param, e.value.code) == ("messages", "empty_prompt")
    with pytest.raises(InvalidRequest) as e:
        build_job("chat", _chat(), entry, [5] * 256, prompt_param="messages", default_max=None)
    assert (e.value.param, e.value.code) == ("messages", "context_length_exceeded")
    with pytest.raises(InvalidRequest) as e:
        build_job(
            "chat",
            _chat(max_completion_tokens=60),
            entry,
            [5] * 200,
            prompt_param="messages",
            default_max=None,
        )
    assert (e.value.param, e.value.code) == ("max_completion_tokens", "context_length_exceeded")
    assert "at most 56 tokens" in e.value.message
