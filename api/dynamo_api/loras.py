"""LoRA adapters on the workers: the system port's ``/v1/loras`` contract, and which workers serve a base
model. Pure; the HTTP calls are :mod:`dynamo_clients.lora_client`.

The contract (NVIDIA Dynamo's shape, on every worker's system port, 9090 in pods)::

    POST   /v1/loras            {"lora_name", "source": {"uri"}, "pinned"?}  -> 200 {"status": "success"}
    GET    /v1/loras            -> 200 {"status": "success", "loras": [{"lora_name", "uri", "rank",
                                                                      "pinned"}], "count"}
    DELETE /v1/loras/<name>     -> 200; 404 when the worker does not hold it

An error is ``{"status": "error", "reason": <one of REASONS>, "message": <the problem and the fix>}``.
A load of an adapter the worker already holds from the same source succeeds (idempotent).

Which workers a ``DynamoModel`` targets: every prefill, decode and aggregated worker service of a graph
whose base model is the model's ``baseModelName``. A service's base model is its ``modelRef.name`` when
it declares one (NVIDIA Dynamo's link), else the name it serves (``--served-model-name``, else
``--model-path``): ``modelRef`` wins, since it is the name written for this purpose.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dynamo_api.components import Component, components
from dynamo_api.models import DynamoGraphDeployment
from dynamo_api.sglang_args import argv, flag_value, served_model_name

__all__ = [
    "ADAPTER_ROLES",
    "INCOMPATIBLE_ADAPTER",
    "INVALID_REQUEST",
    "INVALID_SOURCE",
    "LOAD_FAILED",
    "LORAS_PATH",
    "LORA_NOT_ENABLED",
    "LORA_NOT_SUPPORTED",
    "NAME_CONFLICT",
    "NOT_FOUND",
    "NOT_READY",
    "NO_FREE_SLOT",
    "PERMANENT_REASONS",
    "RANK_TOO_LARGE",
    "REASONS",
    "SOURCE_UNREACHABLE",
    "HeldAdapter",
    "Refusal",
    "adapter_services",
    "base_model_of",
    "load_body",
    "lora_enabled",
    "parse_listing",
    "parse_refusal",
    "same_source",
]

LORAS_PATH: Final = "/v1/loras"

LORA_NOT_ENABLED: Final = "LoraNotEnabled"
LORA_NOT_SUPPORTED: Final = "LoraNotSupported"  # LoRA is on, but the engine can load none (dummy weights)
INVALID_SOURCE: Final = "InvalidSource"
SOURCE_UNREACHABLE: Final = "SourceUnreachable"
RANK_TOO_LARGE: Final = "RankTooLarge"
INCOMPATIBLE_ADAPTER: Final = "IncompatibleAdapter"
NO_FREE_SLOT: Final = "NoFreeSlot"
NOT_FOUND: Final = "NotFound"
INVALID_REQUEST: Final = "InvalidRequest"  # the body is not the contract's
NAME_CONFLICT: Final = "NameConflict"  # the name is loaded from another source: unload it first
NOT_READY: Final = "NotReady"  # the engine is starting, or the worker draining
LOAD_FAILED: Final = "LoadFailed"  # the engine refused, or did not finish in its bound
REASONS: Final = (
    LORA_NOT_ENABLED,
    LORA_NOT_SUPPORTED,
    INVALID_SOURCE,
    SOURCE_UNREACHABLE,
    RANK_TOO_LARGE,
    INCOMPATIBLE_ADAPTER,
    NO_FREE_SLOT,
    NOT_FOUND,
    INVALID_REQUEST,
    NAME_CONFLICT,
    NOT_READY,
    LOAD_FAILED,
)
# Refusals that another try of the same load on the same worker cannot change: the spec, the adapter's
# files or the worker's flags must change first. (SourceUnreachable, NoFreeSlot, NotReady and
# LoadFailed may pass later.)
PERMANENT_REASONS: Final = frozenset(
    {
        LORA_NOT_ENABLED,
        LORA_NOT_SUPPORTED,
        INVALID_SOURCE,
        RANK_TOO_LARGE,
        INCOMPATIBLE_ADAPTER,
        INVALID_REQUEST,
    }
)
# The worker roles that serve a model's tokens, and so need its adapters.
ADAPTER_ROLES: Final = ("agg", "prefill", "decode")
_ENABLE_FLAGS: Final = ("--enable-lora", "--lora-paths")  # SGLang enables LoRA with either


@dataclass(frozen=True)
class HeldAdapter:
    """An adapter a worker lists as loaded."""

    name: str
    uri: str
    rank: int | None = None
    pinned: bool = False


@dataclass(frozen=True)
class Refusal:
    """A worker's answer to a load or unload it did not do: its reason (``REASONS``, or ``HttpNNN`` for
    an answer outside the contract) and its message (the problem and the fix)."""

    reason: str
    message: str

    @property
    def permanent(self) -> bool:
        return self.reason in PERMANENT_REASONS


def load_body(name: str, uri: str, *, pinned: bool = False) -> dict[str, Any]:
    """The body of ``POST /v1/loras``."""
    return {"lora_name": name, "source": {"uri": uri}, "pinned": pinned}


def parse_listing(body: Any) -> dict[str, HeldAdapter]:
    """The adapters of a ``GET /v1/loras`` answer, by name. Raises ValueError for another shape."""
    if not isinstance(body, Mapping) or not isinstance(body.get("loras"), list):
        raise ValueError(f"expected {{'loras': [...]}} from GET {LORAS_PATH}, got {str(body)[:200]}")
    held = {}
    for item in body["loras"]:
        if not isinstance(item, Mapping) or not isinstance(item.get("lora_name"), str):
            raise ValueError(f"expected {{'lora_name': ...}} in GET {LORAS_PATH}, got {str(item)[:200]}")
        rank = item.get("rank")
        held[item["lora_name"]] = HeldAdapter(
            name=item["lora_name"],
            uri=str(item.get("uri") or ""),
            rank=rank if isinstance(rank, int) else None,
            pinned=bool(item.get("pinned")),
        )
    return held


def parse_refusal(status: int, body: Any) -> Refusal:
    """A non-2xx answer of the worker as a Refusal (the contract's reason and message when it sent one)."""
    if isinstance(body, Mapping) and isinstance(body.get("reason"), str):
        return Refusal(body["reason"], str(body.get("message") or body["reason"]))
    return Refusal(f"Http{status}", f"the worker answered HTTP {status}: {str(body)[:300]}")


def _normal(uri: str) -> str:
    path = uri.removeprefix("file://") if uri.startswith("file:///") else uri
    return path.rstrip("/")


def same_source(listed: str, wanted: str) -> bool:
    """Whether a worker's listed adapter came from ``wanted`` (``file:///p`` and ``/p`` are one source;
    a trailing ``/`` does not count). An empty listed uri (the worker does not say) counts as the same."""
    return not listed or _normal(listed) == _normal(wanted)


def lora_enabled(tokens: Sequence[str]) -> bool:
    """Whether an SGLang worker with these arguments serves LoRA adapters."""
    return any(flag_value(tokens, flag) is not None for flag in _ENABLE_FLAGS)


def base_model_of(c: Component) -> str | None:
    """The base model a worker service serves, for DynamoModels: ``modelRef.name``, else its served name."""
    if c.spec.model_ref is not None:
        return c.spec.model_ref.name
    return served_model_name(argv(c.command_view))


def adapter_services(dgd: DynamoGraphDeployment, base_model: str) -> list[Component]:
    """The prefill, decode and aggregated worker services of ``dgd`` serving ``base_model``."""
    return [
        c
        for c in components(dgd)
        if c.kind == "worker" and c.role in ADAPTER_ROLES and base_model_of(c) == base_model
    ]
