"""Every error a client can get, in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Hierarchy (all ``ApiError``, each with its HTTP status):

    ApiError
    +-- InvalidRequest (400, type invalid_request_error; ``param`` names the offending field)
    |   +-- RequestTimeout (408: the request body did not arrive in time)
    +-- ModelNotFound (404, type invalid_request_error, code model_not_found)
    +-- AdapterNotFound (404, the same: a LoRA adapter the model's workers do not hold)
    +-- TooManyRequests (429, type rate_limit_error: the model's wait queue is full, code queue_full)
    +-- ServiceUnavailable (503, type service_unavailable; code says why: no_workers, no_prefill_workers,
    |                       overloaded, model_loading, queue_timeout, model_scaling_up)
    +-- UpstreamError (502, type upstream_error: a worker failed, died or timed out while serving)
        +-- WorkerLost (the worker itself is lost to this request: unreachable, stream broken or
        |               stalled; ``instance_id`` and ``role`` name it, and the request may migrate)
        +-- UpstreamTimeout (504: a bounded phase of the request did not complete in time, e.g. the
                             KV handoff of a disaggregated request, code kv_transfer_timeout)

Handlers raise these; the server turns them into a JSON response (or an SSE ``data: {"error": ...}``
event once a stream has started). The body's models (``ErrorResponse``) are here, not with the other
bodies in ``protocol``: every room of the frontend raises these, and none needs the output room
for it.
"""

from __future__ import annotations

from typing import Any

from dynamo_api.errors import DynamoError
from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = [
    "AdapterNotFound",
    "ApiError",
    "ErrorDetail",
    "ErrorResponse",
    "InvalidRequest",
    "ModelNotFound",
    "RequestTimeout",
    "ServiceUnavailable",
    "TooManyRequests",
    "UpstreamError",
    "UpstreamTimeout",
    "WorkerLost",
    "from_validation_error",
]


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error's body, and the last SSE event of a stream that failed after it started."""

    model_config = ConfigDict(extra="forbid")

    error: ErrorDetail


class ApiError(DynamoError):
    status = 500
    type = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        detail = ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=detail).model_dump()


class InvalidRequest(ApiError):
    status = 400
    type = "invalid_request_error"


class RequestTimeout(InvalidRequest):
    status = 408


class ModelNotFound(ApiError):
    status = 404
    type = "invalid_request_error"

    def __init__(self, model: str, available: list[str]) -> None:
        served = ", ".join(sorted(available)) or "none"
        super().__init__(
            f"The model '{model}' does not exist or no worker serves it. Served models: {served}. "
            "Use one of them (GET /v1/models lists them).",
            param="model",
            code="model_not_found",
        )


class AdapterNotFound(ApiError):
    """A LoRA adapter that the workers of a served model do not hold (404, like an unknown model)."""

    status = 404
    type = "invalid_request_error"

    def __init__(self, model: str, base: str, adapters: list[str]) -> None:
        held = ", ".join(sorted(adapters)) or "none"
        super().__init__(
            f"The model '{model}' names a LoRA adapter that no worker of model '{base}' holds. Its adapters: "
            f"{held}. Use one of them (by name, or '{base}:<adapter>'), or load it on the workers first "
            "(its DynamoModel, or POST /v1/loras on each worker).",
            param="model",
            code="model_not_found",
        )


class TooManyRequests(ApiError):
    status = 429
    type = "rate_limit_error"


class ServiceUnavailable(ApiError):
    status = 503
    type = "service_unavailable"


class UpstreamError(ApiError):
    status = 502
    type = "upstream_error"


class UpstreamTimeout(UpstreamError):
    status = 504


class WorkerLost(UpstreamError):
    """A worker stopped serving a request it had taken (or never answered): not the request's fault,
    so another worker of ``role`` may continue it (``serving.migration``)."""

    def __init__(self, message: str, *, code: str, instance_id: str, role: str) -> None:
        super().__init__(message, code=code)
        self.instance_id = instance_id
        self.role = role


_TYPE_LABELS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "TextPart"})


def _param_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in part or "-" in part or part in _TYPE_LABELS:
            continue  # pydantic's union-member labels ("str", "list[int]") are not field names
        else:
            out += f".{part}" if out else part
    return out


def _clean(msg: str) -> str:
    return msg[len("Value error, ") :] if msg.startswith("Value error, ") else msg


def from_validation_error(error: ValidationError) -> InvalidRequest:
    """The first problem pydantic found, as a 400 naming the field. For a field that accepts several
    shapes (``stop``: a string or a list), every shape's complaint is listed."""
    errors = error.errors(include_url=False)
    param = _param_path(tuple(errors[0]["loc"]))
    msgs: list[str] = []
    for e in errors:
        p = _param_path(tuple(e["loc"]))
        if p == param or (param and p.startswith((param + ".", param + "["))):
            detail = _clean(e["msg"])
            if p != param:
                detail += f" (at '{p}')"
            if detail not in msgs:
                msgs.append(detail)
    where = f"'{param}'" if param else "the request body"
    return InvalidRequest(
        f"Invalid value for {where}: {'; or: '.join(msgs)}.", param=param or None, code="invalid_value"
    )
