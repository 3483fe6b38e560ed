"""Tool-call and reasoning parsers (ours, with SGLang's names): each model family's golden output
becomes the same message whether it arrives whole or in arbitrary pieces, partial markers never leak
into the content, and malformed calls stay visible as text instead of disappearing."""

from __future__ import annotations

import json

import pytest
from dynamo_worker.frontend.output.chat_output import AnswerParser, AnswerStream, tool_choice_schema
from dynamo_worker.frontend.output.reasoning import REASONING_PARSERS
from dynamo_worker.frontend.output.tools import TOOL_PARSERS, supported_tool_parsers
from dynamo_worker.frontend.protocol import ChatDelta
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.integration.frontend.features_stack import FAMILIES


def fold(parser: AnswerParser, pieces: list[str]) -> dict:
    stream = AnswerStream(parser)
    deltas = [d for p in pieces for d in stream.push(p)] + stream.finish()
    out = {"reasoning": "", "content": "", "calls": {}}
    for d in deltas:
        out["reasoning"] += d.reasoning_content or ""
        out["content"] += d.content or ""
        for tc in d.tool_calls or []:
            call = out["calls"].setdefault(tc.index, {"name": None, "arguments": ""})
            if tc.id is not None:
                assert tc.type == "function" and call["name"] is None
                call["name"] = tc.function.name
            call["arguments"] += tc.function.arguments or ""
    out["calls"] = [(c["name"], json.loads(c["arguments"])) for _, c in sorted(out["calls"].items())]
    return out


def whole(parser: AnswerParser, text: str) -> dict:
    stream = AnswerStream(parser)
    stream.push(text)
    stream.finish()
    m = stream.message()
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls or []]
    return {"reasoning": m.reasoning_content or "", "content": m.content or "", "calls": calls}


def family_parser(model: str) -> AnswerParser:
    flags = FAMILIES[model][0]
    tool = flags[flags.index("--tool-call-parser") + 1]
    reasoning = flags[flags.index("--reasoning-parser") + 1] if "--reasoning-parser" in flags else None
    return AnswerParser(reasoning=REASONING_PARSERS.get(reasoning or ""), tool_parser=tool, tool_mode="auto")


GOLDEN = [
    (model, keyword, reply) for model, (_, replies) in FAMILIES.items() for keyword, reply in replies.items()
]


@pytest.mark.parametrize(("model", "keyword", "reply"), GOLDEN, ids=[f"{m}-{k}" for m, k, _ in GOLDEN])
def test_golden_outputs_parse_to_the_expected_message(model, keyword, reply):
    got = whole(family_parser(model), reply)
    paris, tokyo = ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Tokyo"})
    if keyword == "one call":
        assert got["calls"] == [paris]
    elif keyword == "two calls":
        assert got["calls"] == [paris, tokyo]
    else:
        assert got["calls"] == [] and got["content"] == "Paris." and "Paris" in got["reasoning"]
    for marker in ("<tool_call>", "<|", "[TOOL_CALLS]", "\uff5c", "<think>", "</think>"):
        assert marker not in got["content"] and marker not in got["reasoning"]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_chunking_of_a_golden_output_streams_the_same_message(data):
    model, _, reply = data.draw(st.sampled_from(GOLDEN))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(reply)), max_size=12)))
    pieces = [reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)], strict=True)]
    parser = family_parser(model)
    assert fold(parser, pieces) == whole(parser, reply)


@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(
        st.sampled_from(
            [
                *"ab <>/{}\"':;[]|_\n",
                "<tool_call>",
                "</tool_call>",
                "<think>",
                "</think>",
                '{"name": "f"}',
                "[TOOL_CALLS]",
            ]
        ),
        max_size=20,
    ).map("".join),
    name=st.sampled_from(sorted(TOOL_PARSERS)),
    reasoning=st.sampled_from([None, "qwen3", "deepseek-r1"]),
    cuts=st.lists(st.integers(0, 60), max_size=4),
)
def test_streaming_arbitrary_text_gives_the_whole_answer(text, name, reasoning, cuts):
    parser = AnswerParser(
        tool_parser=name, tool_mode="auto", reasoning=REASONING_PARSERS.get(reasoning or "")
    )
    bounds = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True)]
    assert fold(parser, chunks) == whole(parser, text)


def test_a_partial_marker_is_held_back_until_it_is_decided():
    stream = AnswerStream(AnswerParser(tool_parser="qwen25", tool_mode="auto"))
    assert stream.push("Sure <tool") == [ChatDelta(content="Sure")]
    assert stream.push("box> done") == [ChatDelta(content=" <toolbox> done")]


def test_a_malformed_call_stays_content():
    text = "<tool_call>\n{not json}\n</tool_call>"
    got = whole(AnswerParser(tool_parser="hermes", tool_mode="auto"), text)
    assert got["calls"] == [] and got["content"] == text


def test_an_unterminated_call_at_the_end_still_counts():
    got = whole(
        AnswerParser(tool_parser="qwen25", tool_mode="auto"), '<tool_call>{"name": "f", "arguments": {}}'
    )
    assert got["calls"] == [("f", {})]


def test_deepseek_r1_without_end_of_thinking_is_all_reasoning_and_qwen3_without_think_is_content():
    r1 = whole(AnswerParser(reasoning=REASONING_PARSERS["deepseek-r1"]), "still thinking")
    assert (r1["reasoning"], r1["content"]) == ("still thinking", "")
    q3 = whole(AnswerParser(reasoning=REASONING_PARSERS["qwen3"]), "no thinking here")
    assert (q3["reasoning"], q3["content"]) == ("", "no thinking here")


def test_required_and_named_tool_choice_read_the_constrained_json():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    schema = tool_choice_schema(tools, None)
    assert schema["items"]["anyOf"][0]["properties"]["name"]["enum"] == ["f"]
    required = AnswerParser(tool_mode="required")
    assert whole(required, '[{"name": "f", "parameters": {"a": 1}}]')["calls"] == [("f", {"a": 1})]
    named = AnswerParser(tool_mode="named", named="f")
    assert whole(named, '{"a": 2}')["calls"] == [("f", {"a": 2})]
    assert whole(named, "not json")["content"] == "not json"


def test_supported_names_are_sglangs():
    assert {"llama3", "qwen", "qwen25", "hermes", "mistral", "deepseekv3", "deepseekv31", "gpt-oss"} <= set(
        supported_tool_parsers()
    )
    assert {"deepseek-r1", "qwen3", "gpt-oss"} <= set(REASONING_PARSERS)


@pytest.mark.parametrize(
    ("parser", "prefix"),
    [
        (
            AnswerParser(reasoning=REASONING_PARSERS["qwen3"], tool_parser="qwen25", tool_mode="auto"),
            "<think>",
        ),
        (AnswerParser(reasoning=REASONING_PARSERS["gpt-oss"], tool_parser="gpt-oss", tool_mode="auto"), ""),
        (AnswerParser(tool_parser="llama3", tool_mode="auto"), ""),
        (AnswerParser(tool_parser="deepseekv3", tool_mode="auto"), ""),
    ],
)
def test_a_long_answer_is_not_reparsed_from_its_start(parser, prefix):
    """What the parsers settle is never read again: the text kept for re-parsing stays short while a
    long reasoning block and a long answer stream through (a long answer costs linear time)."""
    stream = AnswerStream(parser)
    thinking = "<|channel|>analysis<|message|>" if parser.harmony else prefix
    answer = "<|end|><|start|>assistant<|channel|>final<|message|>" if parser.harmony else "</think>"
    longest = 0
    for piece in [thinking, *["think more " * 3] * 500, answer, *["and say it " * 3] * 500]:
        stream.push(piece)
        longest = max(longest, len(stream._tail))
    stream.finish()
    assert longest < 200, longest
    message = stream.message()
    content = message.content or ""
    assert content.rstrip().endswith("and say it") and len(content) > 10_000
    if parser.reasoning is not None:
        assert content.startswith("and say it") and len(message.reasoning_content or "") > 10_000


@settings(max_examples=150, deadline=None)
@given(
    pieces=st.lists(
        st.sampled_from(
            [
                "<|channel|>",
                "analysis",
                "final",
                "commentary to=functions.f ",
                "<|constrain|>json",
                "<|message|>",
                "<|end|>",
                "<|call|>",
                "<|start|>assistant",
                '{"a": 1}',
                "hi ",
                "\n",
                "<|",
            ]
        ),
        max_size=16,
    ),
    cuts=st.lists(st.integers(0, 200), max_size=6),
)
def test_harmony_streams_like_the_whole_answer_for_any_text_and_chunking(pieces, cuts):
    text = "".join(pieces)
    bounds = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True)]
    parser = AnswerParser(reasoning=REASONING_PARSERS["gpt-oss"], tool_parser="gpt-oss", tool_mode="auto")
    assert fold(parser, chunks) == whole(parser, text)
