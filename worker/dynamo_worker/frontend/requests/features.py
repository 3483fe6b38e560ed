"""What a request asks for beyond plain text, checked against what its model serves (the model card's
``ServingFeatures``), and turned into the worker request and the answer's parsing.

Every problem a client can cause is a 400 naming the field and the fix: a chat request to an embedding
model (or the reverse), tools for a model whose workers run no ``--tool-call-parser``, structured
output from workers started with ``--grammar-backend none``, two grammars at once.

- ``response_format`` ``json_object`` -> the JSON schema ``{"type": "object"}``; ``json_schema`` -> its
  schema; SGLang's ``structural_tag`` format, ``regex`` / ``ebnf`` (and ``json_schema`` text for
  completions) as they are. All go
  to the worker as ``GenerateRequest.structured``, i.e. SGLang's sampling parameters of those names.
- ``tool_choice``: ``none`` drops the tools (not even shown to the template, as SGLang does); ``auto``
  (the default with tools) parses calls with the model's tool-call parser; ``required`` and a named
  function constrain decoding to JSON (``chat_output.tool_choice_schema``), so they need a grammar
  backend but no parser.
- ``reasoning_effort`` and ``chat_template_kwargs`` reach the chat template (gpt-oss reads the former).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from dynamo_worker.frontend.errors import InvalidRequest
from dynamo_worker.frontend.output.chat_output import AnswerParser, tool_choice_schema
from dynamo_worker.frontend.output.reasoning import REASONING_PARSERS
from dynamo_worker.frontend.output.tools import HARMONY_PARSER, TOOL_PARSERS, supported_tool_parsers
from dynamo_worker.frontend.requests.feature_fields import NamedToolChoice, check_schema
from dynamo_worker.frontend.requests.openai_models import ChatCompletionRequest, CompletionRequest
from dynamo_worker.protocol import ServingFeatures, StructuredOutput

log = logging.getLogger(__name__)

__all__ = [
    "FeaturePlan",
    "chat_messages",
    "check_endpoint",
    "plan_chat",
    "plan_completion",
    "served_features",
]

_RESERVED_TEMPLATE_VARS = frozenset({"messages", "add_generation_prompt", "tools", "documents"})


@dataclass
class FeaturePlan:
    """What serving does differently for this request (``None`` from ``plan_*``: nothing); a job with
    one is served by ``serving.featured_run``."""

    structured: StructuredOutput | None = None
    logprobs: int | None = None  # None: off; k: each token's logprob and k alternatives
    answer: AnswerParser | None = None  # chat: how the text becomes reasoning / content / tool calls
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def generate_update(self) -> dict[str, Any]:
        return {"structured": self.structured, "logprobs": self.logprobs}


def served_features(preprocessor: Any) -> ServingFeatures:
    """What the model's workers serve (its model card's ``ServingFeatures``)."""
    return getattr(preprocessor, "features", None) or ServingFeatures()


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


def _arguments(text: str) -> Any:
    """Templates read a replayed call's arguments as a mapping (``tool_call.arguments | tojson``)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def chat_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The messages as chat templates expect them (HF's ``apply_chat_template`` shape)."""
    out: list[dict[str, Any]] = []
    for m in req.messages:
        msg: dict[str, Any] = {"role": m.role, "content": m.text() or ""}
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


def _grammar(features: ServingFeatures, model: str, param: str) -> None:
    if features.grammar_backend == "none":
        raise InvalidRequest(
            f"The workers of model '{model}' have no grammar backend (started with --grammar-backend none, "
            "or with --skip-tokenizer-init, under which SGLang turns grammars off), so they cannot "
            f"constrain decoding for '{param}'. Start them with --grammar-backend xgrammar and without "
            f"--skip-tokenizer-init, or drop '{param}'.",
            param=param,
            code="grammar_backend_disabled",
        )


def _one_grammar(candidates: list[tuple[str, StructuredOutput]]) -> StructuredOutput | None:
    if len(candidates) > 1:
        names = [p for p, _ in candidates]
        raise InvalidRequest(
            f"Only one constraint on the output is possible at a time, but the request sets "
            f"{', '.join(repr(n) for n in names)}; keep one of them.",
            param=names[1],
            code="invalid_value",
        )
    return candidates[0][1] if candidates else None


def _extension_grammars(req: ChatCompletionRequest | CompletionRequest) -> list[tuple[str, StructuredOutput]]:
    found: list[tuple[str, StructuredOutput]] = []
    if req.regex is not None:
        found.append(("regex", StructuredOutput(regex=req.regex)))
    if req.ebnf is not None:
        found.append(("ebnf", StructuredOutput(ebnf=req.ebnf)))
    return found


def plan_chat(req: ChatCompletionRequest, features: ServingFeatures) -> FeaturePlan | None:
    check_endpoint(features, "chat", req.model)
    plan = FeaturePlan()
    grammars: list[tuple[str, StructuredOutput]] = []
    rf = req.response_format
    if rf is not None and rf.type == "json_object":
        grammars.append(("response_format", StructuredOutput(json_schema='{"type": "object"}')))
    elif rf is not None and rf.type == "json_schema" and rf.json_schema is not None:
        grammars.append(("response_format", StructuredOutput(json_schema=json.dumps(rf.json_schema.schema_))))
    elif rf is not None and rf.type == "structural_tag":
        grammars.append(("response_format", StructuredOutput(structural_tag=rf.structural_tag())))
    grammars += _extension_grammars(req)

    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    answer = AnswerParser(parallel=req.parallel_tool_calls)
    if tools and choice != "none":
        plan.template_kwargs["tools"] = tools
        if choice == "auto":
            parser = features.tool_call_parser
            if parser is None or (parser not in TOOL_PARSERS and parser != HARMONY_PARSER):
                why = (
                    "run without --tool-call-parser"
                    if parser is None
                    else f"run --tool-call-parser {parser}, which this frontend does not parse"
                )
                raise InvalidRequest(
                    f"The workers of model '{req.model}' {why}, so tool calls cannot be recognized. Start "
                    f"them with --tool-call-parser (one of {', '.join(supported_tool_parsers())}), or use "
                    "tool_choice 'required' or a named function (constrained decoding), or drop 'tools'.",
                    param="tools",
                    code="no_tool_parser",
                )
            answer.tool_mode, answer.tool_parser = "auto", parser
        else:
            named = choice.function.name if isinstance(choice, NamedToolChoice) else None
            answer.tool_mode, answer.named = ("named" if named else "required"), named
            schema = tool_choice_schema(tools, named)
            grammars.append(("tool_choice", StructuredOutput(json_schema=json.dumps(schema))))
    plan.structured = _one_grammar(grammars)
    if plan.structured is not None:
        _grammar(features, req.model, grammars[0][0])
    reasoning = REASONING_PARSERS.get(features.reasoning_parser or "")
    if features.reasoning_parser and reasoning is None:
        log.warning("Unknown reasoning parser %s: reasoning stays in content", features.reasoning_parser)
    if reasoning is not None and req.separate_reasoning and plan.structured is None:
        answer.reasoning = reasoning
    if answer.reasoning is not None or answer.tool_mode != "off":
        plan.answer = answer
    if req.logprobs:
        plan.logprobs = req.top_logprobs or 0
    if req.reasoning_effort is not None:
        plan.template_kwargs["reasoning_effort"] = req.reasoning_effort
    for key, value in (req.chat_template_kwargs or {}).items():
        if key in _RESERVED_TEMPLATE_VARS:
            raise InvalidRequest(
                f"chat_template_kwargs may not set '{key}'; the request's own fields set it.",
                param=f"chat_template_kwargs.{key}",
                code="invalid_value",
            )
        plan.template_kwargs[key] = value
    special = plan.structured is not None or plan.logprobs is not None or plan.answer is not None
    return plan if special or plan.template_kwargs else None


def plan_completion(req: CompletionRequest, features: ServingFeatures) -> FeaturePlan | None:
    check_endpoint(features, "completion", req.model)
    grammars = []
    if req.json_schema is not None:
        try:
            schema = json.loads(req.json_schema)
            check_schema(schema, "json_schema")
        except ValueError as e:
            raise InvalidRequest(
                f"Invalid value for 'json_schema': {e}; send a JSON schema as a JSON string.",
                param="json_schema",
                code="invalid_value",
            ) from None
        grammars.append(("json_schema", StructuredOutput(json_schema=req.json_schema)))
    grammars += _extension_grammars(req)
    plan = FeaturePlan(structured=_one_grammar(grammars), logprobs=req.logprobs)
    if plan.structured is not None:
        _grammar(features, req.model, grammars[0][0])
    return plan if plan.structured is not None or plan.logprobs is not None else None
