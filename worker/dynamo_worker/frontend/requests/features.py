"""What a request asks for beyond plain text, checked against what its model serves (the model card's
``ServingFeatures``), and turned into the worker request and the answer's parsing: the ``FeaturePlan``,
and the checks chat (``requests.chat``) and completions (``requests.completions``) share.

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

from dataclasses import dataclass, field
from typing import Any

from dynamo_worker.frontend.errors import InvalidRequest
from dynamo_worker.frontend.output.chat_output import AnswerParser
from dynamo_worker.frontend.protocol import ChatCompletionRequest, CompletionRequest
from dynamo_worker.protocol import ServingFeatures, StructuredOutput

__all__ = ["FeaturePlan", "Grammar", "check_endpoint", "constraint", "extension_grammars", "served_features"]

# A constraint on the output as the request names it: (its field, the grammar).
Grammar = tuple[str, StructuredOutput]


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

    def shapes_answer(self) -> bool:
        """Whether the answer is served differently (else the plan did its part in the chat template)."""
        return self.structured is not None or self.logprobs is not None or self.answer is not None


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
