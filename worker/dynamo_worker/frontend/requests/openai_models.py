"""OpenAI request bodies as pydantic models, parsed strictly from the raw JSON bytes.

``parse_request`` turns malformed JSON, wrong types, out-of-range values and unsupported options into
``InvalidRequest`` naming the field (``param``), e.g. ``messages[0].role`` or ``n``. Fields OpenAI
defines that we do not know are ignored, as OpenAI-compatible servers do; options we know but cannot
honour (``n`` > 1, ``logit_bias``, the legacy ``functions``/``function_call``, ``audio``,
``stream_options`` without ``stream``, ``echo``, ``best_of``, ``suffix``) are refused, never silently
dropped. ``n`` > 1 is refused on purpose: one request is one sequence on one worker, and a client that
wants several samples sends several requests (which the router then spreads over workers).

Tools (``tools``, ``tool_choice``, ``parallel_tool_calls``, a message's ``tool_calls`` and
``tool_call_id``), structured output (``response_format``), ``logprobs``/``top_logprobs`` and
``reasoning_effort`` are accepted here and checked against what the model serves in
``requests.features``.

Extensions beyond OpenAI (as in vLLM/SGLang): ``top_k``, ``min_p``, ``min_tokens``, ``ignore_eos``,
``stop_token_ids``, ``regex``, ``ebnf`` (and ``json_schema`` as text for completions) for constrained
decoding, ``chat_template_kwargs`` and ``separate_reasoning`` for chat. ``nvext`` (NVIDIA Dynamo's
extension object, ``NvExt``) carries what the wait queue reads (``serving.admission``):
``agent_hints.priority`` and ``request_ttl``; its other fields are accepted and ignored.
"""

from __future__ import annotations

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
from dynamo_worker.frontend.requests.feature_fields import (
    MessageToolCall,
    NamedToolChoice,
    ResponseFormat,
    Tool,
)

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ImageUrlPart",
    "NvExt",
    "parse_request",
]

MAX_STOP_STRINGS = 16


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class AgentHints(_Body):
    """NVIDIA Dynamo's ``nvext.agent_hints``: ``priority`` orders the wait queue (higher first)."""

    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] | None = None


class NvExt(_Body):
    """NVIDIA Dynamo's ``nvext`` object, as far as this frontend reads it (``serving.admission``)."""

    agent_hints: AgentHints | None = None
    # How long the request may wait for a worker: seconds, or a Go duration ("2s", "1m30s").
    request_ttl: float | Annotated[str, Field(min_length=1, max_length=32)] | None = None

    @property
    def priority(self) -> int | None:
        return self.agent_hints.priority if self.agent_hints is not None else None


class StreamOptions(_Body):
    include_usage: bool = False


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ImageUrl(_Body):
    url: Annotated[str, Field(min_length=1)]
    detail: Literal["auto", "low", "high"] | None = None


class ImageUrlPart(_Body):
    """An image in a user message (``requests.multimodal`` fetches, encodes and places it)."""

    type: Literal["image_url"]
    image_url: ImageUrl


ContentPart = Annotated[TextPart | ImageUrlPart, Field(discriminator="type")]


class ChatMessage(_Body):
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


class _Sampling(_Body):
    """Fields shared by chat and completions."""

    model: Annotated[str, Field(min_length=1, max_length=512)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
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
