"""OpenAI response bodies as pydantic models: the counterpart of ``requests.openai_models`` (the requests).

Field order is declaration order, and it is OpenAI's (``id``, ``object``, ``created``, ``model``,
``choices``, ``usage``); clients and golden files may compare it. What a model leaves out rather
than sending as ``null`` is said on the model: a chat ``delta`` sends only the fields it has, a
chunk's ``usage`` is ``null`` only when the client asked for usage (``stream_options``), and ``/health``
gives a ``reason`` only when unhealthy.

These models are pure data: no aiohttp, no clock. ``output.shaping`` builds them from a job's
results; ``dump`` renders one as JSON bytes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AssistantMessage",
    "ChatChoice",
    "ChatChunkChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatDelta",
    "ChatLogprobs",
    "ChatTokenLogprob",
    "ChatToolCall",
    "ChatToolCallDelta",
    "ChatTopLogprob",
    "Completion",
    "CompletionChoice",
    "CompletionLogprobs",
    "Embedding",
    "EmbeddingList",
    "EmbeddingUsage",
    "FinishReason",
    "FunctionCall",
    "FunctionDelta",
    "GeneratedImages",
    "Health",
    "ImageData",
    "Live",
    "ModelCard",
    "ModelList",
    "PromptTokensDetails",
    "Usage",
    "dump",
]

FinishReason = Literal["stop", "length", "tool_calls"]


class _Wire(BaseModel):
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


class PromptTokensDetails(_Wire):
    cached_tokens: int


class Usage(_Wire):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


# --- logprobs -------------------------------------------------------------------------------------


class ChatTopLogprob(_Wire):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(_Wire):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[ChatTopLogprob]


class ChatLogprobs(_Wire):
    """A chat choice's ``logprobs``: one entry per token."""

    content: list[ChatTokenLogprob]


class CompletionLogprobs(_Wire):
    """A completion choice's ``logprobs``, OpenAI's legacy shape: parallel lists, one item per token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


# --- /v1/chat/completions -------------------------------------------------------------------------


class FunctionCall(_Wire):
    name: str
    arguments: str  # JSON text


class ChatToolCall(_Wire):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(_Wire):
    """The whole answer; ``reasoning_content`` and ``tool_calls`` only when there are some."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = _omitted_if_none()
    tool_calls: list[ChatToolCall] | None = _omitted_if_none()


class ChatChoice(_Wire):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason


class ChatCompletion(_Wire):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class FunctionDelta(_Wire):
    name: str | None = _omitted_if_none()  # in a call's first delta
    arguments: str | None = _omitted_if_none()


class ChatToolCallDelta(_Wire):
    """A call's first delta has ``index``, ``id``, ``type`` and ``function.name``; later ones add to
    ``function.arguments``."""

    index: int
    id: str | None = _omitted_if_none()
    type: Literal["function"] | None = _omitted_if_none()
    function: FunctionDelta


class ChatDelta(_Wire):
    """Only what the chunk adds: ``{"role", "content"}`` first, then ``{"content"}`` (or
    ``{"reasoning_content"}``, ``{"tool_calls"}``), ``{}`` at the end."""

    role: Literal["assistant"] | None = _omitted_if_none()
    content: str | None = _omitted_if_none()
    reasoning_content: str | None = _omitted_if_none()
    tool_calls: list[ChatToolCallDelta] | None = _omitted_if_none()


class ChatChunkChoice(_Wire):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(_Wire):
    """One SSE event. ``usage``: ``null`` on every chunk when the client asked for usage, the counts on
    the last one (with no choices); the key is absent otherwise (``dump(..., exclude={"usage"})``)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


# --- /v1/completions ------------------------------------------------------------------------------


class CompletionChoice(_Wire):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None


class Completion(_Wire):
    """The whole answer (``usage`` set) and each streamed chunk (``usage`` as for chat chunks): OpenAI
    names both ``text_completion``."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


# --- /v1/embeddings -------------------------------------------------------------------------------


class Embedding(_Wire):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # encoding_format float, or base64 of little-endian float32


class EmbeddingUsage(_Wire):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(_Wire):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


# --- /v1/images/generations -----------------------------------------------------------------------


class ImageData(_Wire):
    url: str | None = _omitted_if_none()  # response_format url
    b64_json: str | None = _omitted_if_none()  # response_format b64_json


class GeneratedImages(_Wire):
    created: int
    data: list[ImageData]


# --- /v1/models, /health, /live -------------------------------------------------------------------


class ModelCard(_Wire):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "dynamo"
    root: str | None = _omitted_if_none()  # a LoRA adapter: where it was loaded from (SGLang's field)
    parent: str | None = _omitted_if_none()  # a LoRA adapter: the served model it adapts


class ModelList(_Wire):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(_Wire):
    status: Literal["healthy", "unhealthy"]
    models: list[str]
    reason: str | None = _omitted_if_none()  # unhealthy: why, and what would make it healthy


class Live(_Wire):
    status: Literal["live"] = "live"
