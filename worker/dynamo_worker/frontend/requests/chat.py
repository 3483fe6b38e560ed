"""From a parsed request to the ``Job`` a run serves: ``POST /v1/chat/completions``'s planning step.

A chat request, from the parsed and validated body (``protocol.parse_request``; the server holds it for
a slot in between, ``serving.admission``): look the model up (404 unknown, 503 nobody serving it),
plan the features it uses (``plan_chat``: tools, a grammar, reasoning, logprobs, template variables),
convert the messages (``chat_messages``), render the chat template and tokenize (images through
``requests.chat_images``), and check the context length (``build_job``). A request with images takes
the same steps, so it is served or refused as the same request without them would be.

Features: what a request asks for beyond plain text, checked against what its model serves (the model
card's ``ServingFeatures``) and turned into the worker request and the answer's parsing (the
``FeaturePlan``). Every problem a client can cause is a 400 naming the field and the fix: a chat
request to an embedding model (or the reverse), tools for a model whose workers run no
``--tool-call-parser``, structured output from workers started with ``--grammar-backend none``, two
grammars at once.

- ``response_format`` ``json_object`` -> the JSON schema ``{"type": "object"}``; ``json_schema`` -> its
  schema; SGLang's ``structural_tag`` format, ``regex`` / ``ebnf`` (and ``json_schema`` text for
  completions) as they are. All go to the worker as ``GenerateRequest.structured``, i.e. SGLang's
  sampling parameters of those names.
- ``tool_choice``: ``none`` drops the tools (not even shown to the template, as SGLang does); ``auto``
  (the default with tools) parses calls with the model's tool-call parser; ``required`` and a named
  function constrain decoding to JSON (``chat_output.tool_choice_schema``), so they need a grammar
  backend but no parser.
- ``reasoning_effort`` and ``chat_template_kwargs`` reach the chat template (gpt-oss reads the former).

The features' checks here serve ``requests.completions`` and ``requests.embeddings`` too; the job
every endpoint builds is ``requests.job``.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from dynamo_worker.frontend.errors import InvalidRequest
from dynamo_worker.frontend.models.preprocessor import encode_off_loop
from dynamo_worker.frontend.models.registry import ModelRegistry
from dynamo_worker.frontend.output.chat_output import AnswerParser, tool_choice_schema
from dynamo_worker.frontend.output.reasoning import REASONING_PARSERS, ReasoningParser
from dynamo_worker.frontend.output.tools import HARMONY_PARSER, TOOL_PARSERS, supported_tool_parsers
from dynamo_worker.frontend.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ImageUrlPart,
    NamedToolChoice,
    ResponseFormat,
)
from dynamo_worker.frontend.requests.chat_images import PLACEHOLDER, MultimodalProcessor
from dynamo_worker.frontend.requests.job import FeaturePlan, Grammar, Job, build_job, with_plan
from dynamo_worker.protocol import (
    ServingFeatures,
    StructuredOutput,
)

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

__all__ = [
    "chat_messages",
    "check_endpoint",
    "constraint",
    "extension_grammars",
    "image_urls",
    "plan_chat",
    "prepare_chat",
]

_RESERVED_TEMPLATE_VARS = frozenset({"messages", "add_generation_prompt", "tools", "documents"})


# --- the chat request ------------------------------------------------------------------------------


async def prepare_chat(
    registry: ModelRegistry, multimodal: MultimodalProcessor | None, req: ChatCompletionRequest
) -> Job:
    """The job for ``req``, with or without images: one plan (``plan_chat``), one message conversion
    (``chat_messages``), one chat template; the multimodal processor only turns the rendered chat and
    its images into token ids and image spans."""
    entry = registry.lookup(req.model)
    pre = entry.preprocessor
    assert pre is not None
    images = image_urls(req)
    if images and multimodal is None:
        raise InvalidRequest("This frontend takes no images.", param="messages", code="unsupported")
    plan = plan_chat(req, pre.features)
    kwargs = plan.template_kwargs if plan is not None else {}
    if images:  # processor -> encode worker -> language worker (requests.chat_images)
        assert multimodal is not None
        rendered = pre.render_chat(chat_messages(req, PLACEHOLDER), req.add_generation_prompt, kwargs)
        ids, spans = await multimodal.prompt_ids(entry, pre, rendered, images)
    else:
        messages = chat_messages(req)
        chars = sum(len(m["content"]) for m in messages)
        ids = await encode_off_loop(chars, pre.encode_chat, messages, req.add_generation_prompt, kwargs)
        spans = []
    job = build_job("chat", req, entry, ids, prompt_param="messages", default_max=None)
    if spans:
        job.generate = job.generate.model_copy(update={"images": spans})
    return with_plan(job, plan)


def plan_chat(req: ChatCompletionRequest, features: ServingFeatures) -> FeaturePlan | None:
    """What serving does differently for ``req`` on a model that serves ``features``; ``None``:
    nothing (a plain request). Raises ``InvalidRequest`` for what the model cannot do."""
    check_endpoint(features, "chat", req.model)
    answer = AnswerParser(parallel=req.parallel_tool_calls)
    tools, tool_grammar = _plan_tools(req, features, answer)
    grammars = [*_response_format_grammar(req.response_format), *extension_grammars(req), *tool_grammar]
    structured = constraint(grammars, features, req.model)
    reasoning = _reasoning_parser(features)
    if reasoning is not None and req.separate_reasoning and structured is None:
        answer.reasoning = reasoning  # a grammar constrains the output from its first token
    plan = FeaturePlan(
        structured=structured,
        logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        answer=answer if answer.reasoning is not None or answer.tool_mode != "off" else None,
        template_kwargs=_template_kwargs(req, tools),
    )
    return plan if plan.shapes_answer() or plan.template_kwargs else None


def _response_format_grammar(rf: ResponseFormat | None) -> list[Grammar]:
    """``response_format`` as the grammar it constrains decoding to (``text``: none)."""
    if rf is None:
        return []
    if rf.type == "json_object":
        grammar = StructuredOutput(json_schema='{"type": "object"}')
    elif rf.type == "json_schema" and rf.json_schema is not None:
        grammar = StructuredOutput(json_schema=json.dumps(rf.json_schema.schema_))
    elif rf.type == "structural_tag":
        grammar = StructuredOutput(structural_tag=rf.structural_tag())
    else:
        return []
    return [("response_format", grammar)]


def _plan_tools(
    req: ChatCompletionRequest, features: ServingFeatures, answer: AnswerParser
) -> tuple[list[dict[str, Any]], list[Grammar]]:
    """The tools the chat template shows, and the grammar ``tool_choice`` constrains decoding to; sets
    how ``answer`` reads tool calls. ``none`` drops the tools; ``auto`` (the default with tools) parses
    calls with the model's tool-call parser; ``required`` and a named function constrain to JSON."""
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    if not tools or choice == "none":
        return [], []
    if choice == "auto":
        answer.tool_mode, answer.tool_parser = "auto", _tool_parser(features, req.model)
        return tools, []
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    answer.tool_mode, answer.named = ("named" if named else "required"), named
    schema = tool_choice_schema(tools, named)
    return tools, [("tool_choice", StructuredOutput(json_schema=json.dumps(schema)))]


def _tool_parser(features: ServingFeatures, model: str) -> str:
    """The model's tool-call parser, or a 400 when its workers run none this frontend parses."""
    parser = features.tool_call_parser
    if parser is not None and (parser in TOOL_PARSERS or parser == HARMONY_PARSER):
        return parser
    why = (
        "run without --tool-call-parser"
        if parser is None
        else f"run --tool-call-parser {parser}, which this frontend does not parse"
    )
    raise InvalidRequest(
        f"The workers of model '{model}' {why}, so tool calls cannot be recognized. Start "
        f"them with --tool-call-parser (one of {', '.join(supported_tool_parsers())}), or use "
        "tool_choice 'required' or a named function (constrained decoding), or drop 'tools'.",
        param="tools",
        code="no_tool_parser",
    )


def _reasoning_parser(features: ServingFeatures) -> ReasoningParser | None:
    """The model's reasoning parser (``--reasoning-parser``); an unknown one leaves reasoning in the
    content, with a warning."""
    reasoning = REASONING_PARSERS.get(features.reasoning_parser or "")
    if features.reasoning_parser and reasoning is None:
        log.warning("Unknown reasoning parser %s: reasoning stays in content", features.reasoning_parser)
    return reasoning


def _template_kwargs(req: ChatCompletionRequest, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat template's variables beyond the messages: the tools it shows, ``reasoning_effort``
    (gpt-oss reads it) and ``chat_template_kwargs``, which may not set what the request's own fields
    set."""
    kwargs: dict[str, Any] = {"tools": tools} if tools else {}
    if req.reasoning_effort is not None:
        kwargs["reasoning_effort"] = req.reasoning_effort
    for key, value in (req.chat_template_kwargs or {}).items():
        if key in _RESERVED_TEMPLATE_VARS:
            raise InvalidRequest(
                f"chat_template_kwargs may not set '{key}'; the request's own fields set it.",
                param=f"chat_template_kwargs.{key}",
                code="invalid_value",
            )
        kwargs[key] = value
    return kwargs


def _arguments(text: str) -> Any:
    """Templates read a replayed call's arguments as a mapping (``tool_call.arguments | tojson``)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def chat_messages(req: ChatCompletionRequest, image_mark: str | None = None) -> list[dict[str, Any]]:
    """The messages as chat templates expect them (HF's ``apply_chat_template`` shape), tool calls, tool
    results and reasoning included. ``image_mark``: each image part becomes this text (and the mark is
    taken out of the texts), so the rendered chat shows where the images go; else images are left out."""
    out: list[dict[str, Any]] = []
    for m in req.messages:
        msg: dict[str, Any] = {"role": m.role, "content": _content(m, image_mark)}
        if m.name:
            msg["name"] = m.name
        if m.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": c.id or f"call_{i}",
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)},
                }
                for i, c in enumerate(m.tool_calls)
            ]
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if m.reasoning_content is not None:
            msg["reasoning_content"] = m.reasoning_content
        out.append(msg)
    return out


def image_urls(req: ChatCompletionRequest) -> list[tuple[str, str]]:
    """(param, URL) of each image in the messages, in order."""
    return [
        (f"messages[{i}].content[{j}].image_url", p.image_url.url)
        for i, m in enumerate(req.messages)
        if isinstance(m.content, list)
        for j, p in enumerate(m.content)
        if isinstance(p, ImageUrlPart)
    ]


def _content(m: ChatMessage, image_mark: str | None) -> str:
    if image_mark is None:
        return m.text() or ""
    if isinstance(m.content, list):
        return "".join(
            image_mark if isinstance(p, ImageUrlPart) else p.text.replace(image_mark, "") for p in m.content
        )
    return (m.content or "").replace(image_mark, "")


# --- features -------------------------------------------------------------------------------------


def check_endpoint(features: ServingFeatures, endpoint: str, model: str) -> None:
    if features.model_type == "embedding" and endpoint != "embedding":
        raise InvalidRequest(
            f"Model '{model}' is an embedding model; send its requests to POST /v1/embeddings.",
            param="model",
            code="wrong_endpoint",
        )
    if features.model_type != "embedding" and endpoint == "embedding":
        raise InvalidRequest(
            f"Model '{model}' generates text and serves no embeddings; use an embedding model (workers "
            "started with --is-embedding) or POST /v1/chat/completions.",
            param="model",
            code="wrong_endpoint",
        )


def constraint(candidates: list[Grammar], features: ServingFeatures, model: str) -> StructuredOutput | None:
    """The one grammar the request constrains its output to (``None``: none), refused when it asks
    for several or when the model's workers run no grammar backend."""
    grammar = _one_grammar(candidates)
    if grammar is not None:
        _check_grammar_backend(features, model, candidates[0][0])
    return grammar


def _check_grammar_backend(features: ServingFeatures, model: str, param: str) -> None:
    if features.grammar_backend == "none":
        raise InvalidRequest(
            f"The workers of model '{model}' have no grammar backend (started with --grammar-backend none, "
            "or with --skip-tokenizer-init, under which SGLang turns grammars off), so they cannot "
            f"constrain decoding for '{param}'. Start them with --grammar-backend xgrammar and without "
            f"--skip-tokenizer-init, or drop '{param}'.",
            param=param,
            code="grammar_backend_disabled",
        )


def _one_grammar(candidates: list[Grammar]) -> StructuredOutput | None:
    if len(candidates) > 1:
        names = [p for p, _ in candidates]
        raise InvalidRequest(
            f"Only one constraint on the output is possible at a time, but the request sets "
            f"{', '.join(repr(n) for n in names)}; keep one of them.",
            param=names[1],
            code="invalid_value",
        )
    return candidates[0][1] if candidates else None


def extension_grammars(req: ChatCompletionRequest | CompletionRequest) -> list[Grammar]:
    """The grammars of the extensions beyond OpenAI's fields (``regex``, ``ebnf``)."""
    found: list[Grammar] = []
    if req.regex is not None:
        found.append(("regex", StructuredOutput(regex=req.regex)))
    if req.ebnf is not None:
        found.append(("ebnf", StructuredOutput(ebnf=req.ebnf)))
    return found
