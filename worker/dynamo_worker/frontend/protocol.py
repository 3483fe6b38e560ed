"""The OpenAI wire: request bodies as pydantic models parsed strictly from the raw JSON bytes, the tool
and structured-output fields they carry, and the response bodies this frontend sends (as SGLang's
``protocol.py``). The worker's wire is ``dynamo_worker.protocol``.

More: docs/module-notes.md (dynamo_worker.frontend.protocol)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dynamo_worker.frontend.errors import InvalidRequest, from_validation_error

__all__ = [
    "AssistantMessage",
    "ChatChoice",
    "ChatChunkChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatDelta",
    "ChatLogprobs",
    "ChatMessage",
    "ChatTokenLogprob",
    "ChatToolCall",
    "ChatToolCallDelta",
    "ChatTopLogprob",
    "Completion",
    "CompletionChoice",
    "CompletionLogprobs",
    "CompletionRequest",
    "CompletionUsage",
    "Embedding",
    "EmbeddingList",
    "EmbeddingUsage",
    "FinishReason",
    "FunctionCall",
    "FunctionDef",
    "FunctionDelta",
    "GeneratedImages",
    "Health",
    "ImageData",
    "ImageUrlPart",
    "JsonSchemaFormat",
    "ListedModel",
    "Live",
    "MessageToolCall",
    "ModelList",
    "NamedToolChoice",
    "NvExt",
    "PromptTokensDetails",
    "ResponseFormat",
    "Tool",
    "check_schema",
    "dump",
    "parse_request",
]

# --- requests: tools and structured output -------------------------------------------------------

MAX_SCHEMA_DEPTH = 32
_JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "contains", "if", "then", "else")


class _RequestBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


def check_schema(schema: Any, where: str = "schema", depth: int = 0) -> None:
    """Raise ``ValueError`` naming the first malformed part of a JSON schema: its ``type``, then its
    subschemas (depth first), then its other keywords."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ValueError(f"{where} must be a JSON schema object, got {type(schema).__name__}")
    if depth > MAX_SCHEMA_DEPTH:
        raise ValueError(f"{where} nests deeper than {MAX_SCHEMA_DEPTH} levels")
    _check_type(schema.get("type"), where)
    for sub, sub_where in _subschemas(schema, where):
        check_schema(sub, sub_where, depth + 1)
    _check_keywords(schema, where)


def _check_type(kind: Any, where: str) -> None:
    for k in kind if isinstance(kind, list) else [kind] if kind is not None else []:
        if k not in _JSON_TYPES:
            raise ValueError(f"{where}.type is {k!r}; use one of {', '.join(sorted(_JSON_TYPES))}")


def _subschemas(schema: dict[str, Any], where: str) -> Iterator[tuple[Any, str]]:
    """Each subschema with its place, in order; raises for a keyword that cannot hold schemas."""
    for key in _SCHEMA_MAPS:
        if key in schema:
            value = schema[key]
            if not isinstance(value, dict):
                raise ValueError(f"{where}.{key} must be an object mapping names to schemas")
            yield from ((sub, f"{where}.{key}.{name}") for name, sub in value.items())
    for key in _SCHEMA_LISTS:
        if key in schema:
            value = schema[key]
            if not isinstance(value, list) or not value:
                raise ValueError(f"{where}.{key} must be a non-empty list of schemas")
            yield from ((sub, f"{where}.{key}[{i}]") for i, sub in enumerate(value))
    for key in _SCHEMA_ONE:
        if key in schema:
            yield schema[key], f"{where}.{key}"


def _is_number(value: Any) -> bool:
    return value is None or (not isinstance(value, bool) and isinstance(value, int | float))


# The other keywords a grammar compiler reads: (keyword, whether a value is well-formed, the rule).
# ``null`` counts as unset, except for ``$ref``.
_KEYWORD_RULES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    (
        "required",
        lambda v: v is None or (isinstance(v, list) and all(isinstance(r, str) for r in v)),
        "must be a list of property names",
    ),
    ("enum", lambda v: v is None or (isinstance(v, list) and bool(v)), "must be a non-empty list"),
    *(
        (key, _is_number, "must be a number")
        for key in ("minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems")
    ),
    ("$ref", lambda v: isinstance(v, str), "must be a string"),
)
_ABSENT = object()


def _check_keywords(schema: dict[str, Any], where: str) -> None:
    for key, well_formed, rule in _KEYWORD_RULES:
        value = schema.get(key, _ABSENT)
        if value is not _ABSENT and not well_formed(value):
            raise ValueError(f"{where}.{key} {rule}")


class FunctionDef(_RequestBody):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        check_schema(v, "parameters")
        if v.get("type", "object") != "object":
            raise ValueError("parameters must be a JSON schema of type 'object'")
        return v


class Tool(_RequestBody):
    type: Literal["function"]
    function: FunctionDef


class _FunctionName(_RequestBody):
    name: Annotated[str, Field(min_length=1)]


class NamedToolChoice(_RequestBody):
    type: Literal["function"]
    function: _FunctionName


class _CalledFunction(_RequestBody):
    name: Annotated[str, Field(min_length=1)]
    arguments: str = "{}"


class MessageToolCall(_RequestBody):
    id: str | None = None
    type: Literal["function"] = "function"
    function: _CalledFunction


class JsonSchemaFormat(_RequestBody):
    name: Annotated[str, Field(min_length=1, max_length=64)] = "response"
    description: str | None = None
    schema_: Annotated[dict[str, Any], Field(alias="schema")]
    strict: bool | None = None

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    @field_validator("schema_")
    @classmethod
    def _schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_schema(v, "schema")
        return v


class _Structure(_RequestBody):
    begin: str
    end: str
    schema_: dict[str, Any] | None = Field(None, alias="schema")

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


class ResponseFormat(_RequestBody):
    """OpenAI's ``text`` / ``json_object`` / ``json_schema``, and SGLang's ``structural_tag`` (its legacy
    ``structures`` + ``triggers`` form, or xgrammar's ``format``), passed to the engine as sent."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    structures: list[_Structure] | None = None
    triggers: list[Annotated[str, Field(min_length=1)]] | None = None
    at_least_one: bool | None = None
    format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema' object with a 'schema'")
        if self.type == "structural_tag" and self.format is None and not (self.structures and self.triggers):
            raise ValueError("type 'structural_tag' needs 'structures' and 'triggers', or a 'format'")
        return self

    def structural_tag(self) -> str:
        """The tag as SGLang's engine takes it: this object as JSON."""
        return json.dumps(self.model_dump(exclude_none=True, by_alias=True, exclude={"json_schema"}))


# --- requests -------------------------------------------------------------------------------------

MAX_STOP_STRINGS = 16


class AgentHints(_RequestBody):
    """NVIDIA Dynamo's ``nvext.agent_hints``: ``priority`` orders the wait queue (higher first)."""

    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] | None = None


class NvExt(_RequestBody):
    """NVIDIA Dynamo's ``nvext`` object, as far as this frontend reads it (``serving.admission``)."""

    agent_hints: AgentHints | None = None
    # How long the request may wait for a worker: seconds, or a Go duration ("2s", "1m30s").
    request_ttl: float | Annotated[str, Field(min_length=1, max_length=32)] | None = None

    @property
    def priority(self) -> int | None:
        return self.agent_hints.priority if self.agent_hints is not None else None


class StreamOptions(_RequestBody):
    include_usage: bool = False


class TextPart(_RequestBody):
    type: Literal["text"]
    text: str


class ImageUrl(_RequestBody):
    url: Annotated[str, Field(min_length=1)]
    detail: Literal["auto", "low", "high"] | None = None


class ImageUrlPart(_RequestBody):
    """An image in a user message (``requests.chat_images`` fetches, encodes and places it)."""

    type: Literal["image_url"]
    image_url: ImageUrl


ContentPart = Annotated[TextPart | ImageUrlPart, Field(discriminator="type")]


class ChatMessage(_RequestBody):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _images_from_users(self) -> ChatMessage:
        content = self.content if isinstance(self.content, list) else []
        if self.role != "user" and any(isinstance(p, ImageUrlPart) for p in content):
            raise ValueError(f"images are only allowed in 'user' messages, not in a '{self.role}' message")
        return self

    def text(self) -> str | None:
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, TextPart))

    @model_validator(mode="after")
    def _content_unless_assistant(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a '{self.role}' message needs 'content'")
        return self


class _Sampling(_RequestBody):
    """Fields shared by chat and completions."""

    model: Annotated[str, Field(min_length=1, max_length=512)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=2**31 - 1)] | None = None  # the engine's int32
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    seed: Annotated[int, Field(ge=-(2**63), le=2**64 - 1)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    n: int | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logit_bias: Any = None
    user: str | None = None
    regex: Annotated[str, Field(min_length=1)] | None = None
    ebnf: Annotated[str, Field(min_length=1)] | None = None
    nvext: NvExt | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int | None) -> int | None:
        if v == 0:
            raise ValueError("top_k must be -1 (disabled) or at least 1")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        if v == "" or (isinstance(v, list) and any(s == "" for s in v)):
            raise ValueError("stop strings must not be empty")
        return v

    @field_validator("n")
    @classmethod
    def _n(cls, v: int | None) -> int | None:
        if v is not None and v != 1:
            raise ValueError("only n=1 is supported; send several requests for several choices")
        return v

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if v is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed with stream=true; set 'stream' or drop it")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: Any) -> Any:
        if v:
            raise ValueError("logit_bias is not supported by this server; leave 'logit_bias' unset")
        return v

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: Annotated[list[Tool], Field(max_length=256)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    response_format: ResponseFormat | None = None
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    separate_reasoning: bool = True
    add_generation_prompt: bool = True

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs=true; set 'logprobs' or drop 'top_logprobs'")
        return v

    @field_validator("functions")
    @classmethod
    def _functions(cls, v: Any) -> Any:
        if v:
            raise ValueError("the legacy 'functions' field is not supported; send the functions in 'tools'")
        return v

    @field_validator("function_call")
    @classmethod
    def _function_call(cls, v: Any) -> Any:
        if v not in (None, "none"):
            raise ValueError("the legacy 'function_call' field is not supported; use 'tool_choice'")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: Any, info: ValidationInfo) -> Any:
        tools = info.data.get("tools") or []
        if isinstance(v, NamedToolChoice) and v.function.name not in {t.function.name for t in tools}:
            raise ValueError(
                f"tool_choice names function '{v.function.name}', which is not in 'tools'; name one of "
                f"{sorted(t.function.name for t in tools) or 'the tools you send'}"
            )
        if v == "required" and not tools:
            raise ValueError("tool_choice 'required' needs at least one tool in 'tools'")
        return v

    @field_validator("audio")
    @classmethod
    def _audio(cls, v: Any) -> Any:
        if v is not None:
            raise ValueError("audio output is not supported by this server; leave 'audio' unset")
        return v

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1, max_length=1)]
        | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
        | Annotated[
            list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]],
            Field(min_length=1, max_length=1),
        ]
    )
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    json_schema: Annotated[str, Field(min_length=1)] | None = None

    @field_validator("echo")
    @classmethod
    def _echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported by this server; leave 'echo' unset")
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None) -> int | None:
        if v is not None and v != 1:
            raise ValueError("only best_of=1 is supported")
        return v

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix is not supported by this server; leave 'suffix' unset")
        return v

    def token_limit(self) -> int | None:
        return self.max_tokens

    def prompt_text_or_ids(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, str):
            return p
        first = p[0]
        if isinstance(first, str):
            return first
        if isinstance(first, list):
            return list(first)
        return list(p)  # type: ignore[arg-type]


_M = TypeVar("_M", bound=BaseModel)


def parse_request(model: type[_M], body: bytes) -> _M:
    """Parse and validate a request body, or raise ``InvalidRequest`` naming the problem."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            raise InvalidRequest(
                f"The request body is not valid JSON ({first['msg']}). Send a JSON object with "
                "Content-Type: application/json.",
                code="invalid_json",
            ) from None
        if first["type"] == "model_type" and not first["loc"]:
            raise InvalidRequest("The request body must be a JSON object.", code="invalid_json") from None
        raise from_validation_error(e) from None


# --- responses ------------------------------------------------------------------------------------


FinishReason = Literal["stop", "length", "tool_calls"]


class _ResponseBody(BaseModel):
    """A body this frontend sends: every field ours, none unknown."""

    model_config = ConfigDict(extra="forbid")


def _is_none(value: object) -> bool:
    return value is None


def _omitted_if_none() -> Any:
    """A field that defaults to ``None`` and is left out of the body, not sent as ``null``, while so."""
    return Field(None, exclude_if=_is_none)


def dump(body: BaseModel, *, exclude: set[str] | None = None) -> bytes:
    """``body`` as compact JSON bytes (UTF-8, nothing escaped but what JSON must)."""
    return body.__pydantic_serializer__.to_json(body, exclude=exclude)


# --- usage ----------------------------------------------------------------------------------------


class PromptTokensDetails(_ResponseBody):
    cached_tokens: int


class CompletionUsage(_ResponseBody):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


# --- logprobs -------------------------------------------------------------------------------------


class ChatTopLogprob(_ResponseBody):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(_ResponseBody):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[ChatTopLogprob]


class ChatLogprobs(_ResponseBody):
    """A chat choice's ``logprobs``: one entry per token."""

    content: list[ChatTokenLogprob]


class CompletionLogprobs(_ResponseBody):
    """A completion choice's ``logprobs``, OpenAI's legacy shape: parallel lists, one item per token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


# --- /v1/chat/completions -------------------------------------------------------------------------


class FunctionCall(_ResponseBody):
    name: str
    arguments: str  # JSON text


class ChatToolCall(_ResponseBody):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(_ResponseBody):
    """The whole answer; ``reasoning_content`` and ``tool_calls`` only when there are some."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = _omitted_if_none()
    tool_calls: list[ChatToolCall] | None = _omitted_if_none()


class ChatChoice(_ResponseBody):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason


class ChatCompletion(_ResponseBody):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: CompletionUsage


class FunctionDelta(_ResponseBody):
    name: str | None = _omitted_if_none()  # in a call's first delta
    arguments: str | None = _omitted_if_none()


class ChatToolCallDelta(_ResponseBody):
    """A call's first delta has ``index``, ``id``, ``type`` and ``function.name``; later ones add to
    ``function.arguments``."""

    index: int
    id: str | None = _omitted_if_none()
    type: Literal["function"] | None = _omitted_if_none()
    function: FunctionDelta


class ChatDelta(_ResponseBody):
    """Only what the chunk adds: ``{"role", "content"}`` first, then ``{"content"}`` (or
    ``{"reasoning_content"}``, ``{"tool_calls"}``), ``{}`` at the end."""

    role: Literal["assistant"] | None = _omitted_if_none()
    content: str | None = _omitted_if_none()
    reasoning_content: str | None = _omitted_if_none()
    tool_calls: list[ChatToolCallDelta] | None = _omitted_if_none()


class ChatChunkChoice(_ResponseBody):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(_ResponseBody):
    """One SSE event. ``usage``: ``null`` on every chunk when the client asked for usage, the counts on
    the last one (with no choices); the key is absent otherwise (``dump(..., exclude={"usage"})``)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: CompletionUsage | None = None


# --- /v1/completions ------------------------------------------------------------------------------


class CompletionChoice(_ResponseBody):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None


class Completion(_ResponseBody):
    """The whole answer (``usage`` set) and each streamed chunk (``usage`` as for chat chunks): OpenAI
    names both ``text_completion``."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None


# --- /v1/embeddings -------------------------------------------------------------------------------


class Embedding(_ResponseBody):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # encoding_format float, or base64 of little-endian float32


class EmbeddingUsage(_ResponseBody):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(_ResponseBody):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


# --- /v1/images/generations -----------------------------------------------------------------------


class ImageData(_ResponseBody):
    url: str | None = _omitted_if_none()  # response_format url
    b64_json: str | None = _omitted_if_none()  # response_format b64_json


class GeneratedImages(_ResponseBody):
    created: int
    data: list[ImageData]


# --- /v1/models, /health, /live -------------------------------------------------------------------


class ListedModel(_ResponseBody):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "dynamo"
    root: str | None = _omitted_if_none()  # a LoRA adapter: where it was loaded from (SGLang's field)
    parent: str | None = _omitted_if_none()  # a LoRA adapter: the served model it adapts


class ModelList(_ResponseBody):
    object: Literal["list"] = "list"
    data: list[ListedModel]


class Health(_ResponseBody):
    status: Literal["healthy", "unhealthy"]
    models: list[str]
    reason: str | None = _omitted_if_none()  # unhealthy: why, and what would make it healthy


class Live(_ResponseBody):
    status: Literal["live"] = "live"
