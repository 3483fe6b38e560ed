"""Pydantic model of ``nvidia.com/v1alpha1`` ``DynamoModel`` (short name ``dm``), and its checks. Pure.

NVIDIA Dynamo's shape, so a manifest written for Dynamo applies here: a model served on top of the
graphs of its namespace whose workers serve ``baseModelName``. A ``lora`` (or ``adapter``) model is a
LoRA adapter that the operator loads on every prefill, decode and aggregated worker of those graphs
(from ``source.uri``: ``file://``, ``hf://`` or ``s3://``), and unloads when the resource is deleted;
a ``base`` model only tracks the workers serving it. ``status`` is what the operator observed: each
worker (``endpoints``: address, pod, whether it holds the adapter), the counts, and the conditions
``Ready``, ``EndpointsReady`` and ``ServicesFound`` (docs/lora.md says what each reason means).

``problems(dm)`` is the one judge of a DynamoModel's spec beyond the schema, for the validating
webhook, the operator and dynamo-run alike.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field

from dynamo_api.models import Condition, CrdHint, ObjectMeta, _Model
from dynamo_api.validation import Problem

__all__ = [
    "ADAPTER_TYPES",
    "API_VERSION",
    "ENDPOINTS_READY",
    "FINALIZER",
    "KIND",
    "PLURAL",
    "SERVICES_FOUND",
    "SHORT_NAME",
    "SINGULAR",
    "SOURCE_SCHEMES",
    "VERSION",
    "DynamoModel",
    "EndpointInfo",
    "ModelSource",
    "ModelSpec",
    "ModelStatus",
    "is_relative_file",
    "problems",
]

VERSION: Final = "v1alpha1"
API_VERSION: Final = "nvidia.com/v1alpha1"  # GROUP/VERSION spelled out: its type is the literal
KIND: Final = "DynamoModel"
PLURAL = "dynamomodels"
SINGULAR = "dynamomodel"
SHORT_NAME = "dm"
# What the operator keeps on a LoRA model until it has unloaded it from the workers it can reach.
FINALIZER: Final = "nvidia.com/dynamo-model-unload"

# Conditions (Dynamo's types) beside Ready.
ENDPOINTS_READY: Final = "EndpointsReady"
SERVICES_FOUND: Final = "ServicesFound"

ModelType = Literal["base", "lora", "adapter"]
ADAPTER_TYPES: Final = ("lora", "adapter")  # the types whose source is loaded on the workers
SOURCE_SCHEMES: Final = ("file://", "hf://", "s3://")
# A request names an adapter by its name or as "<base>:<adapter>", so an adapter's name has no ':'.
_NAME_SEPARATOR = ":"


class ModelSource(_Model):
    uri: Annotated[str, Field(min_length=1)] = Field(
        description="Where the adapter's files are: file:///path (a folder the worker pods can read), "
        "hf://org/repo[@revision] or s3://bucket/prefix."
    )


class ModelSpec(_Model):
    model_name: Annotated[str, Field(min_length=1)] = Field(
        description="The model's name: for a LoRA adapter, the name requests use in `model` (alone, or "
        "as <baseModelName>:<modelName>)."
    )
    base_model_name: Annotated[str, Field(min_length=1)] = Field(
        description="The model the workers serve: a worker service's modelRef.name, else its "
        "--served-model-name (else --model-path). Graphs of this namespace serving it are the targets."
    )
    model_type: ModelType = Field(
        "base", description="base (track the workers), lora or adapter (load source.uri on each worker)."
    )
    source: ModelSource | None = Field(
        None, description="The adapter's files; required for lora and adapter."
    )

    @property
    def loads_adapter(self) -> bool:
        return self.model_type in ADAPTER_TYPES


class EndpointInfo(_Model):
    address: str = Field(description="The worker's system port, e.g. http://10.0.1.5:9090.")
    pod_name: str | None = Field(None, description="The worker's pod.")
    ready: bool = Field(
        False, description="lora/adapter: the worker holds the adapter (it lists it); base: it serves."
    )


class ModelStatus(_Model):
    endpoints: list[EndpointInfo] = Field(
        default_factory=list,
        description="Every prefill, decode and aggregated worker serving the base model.",
    )
    ready_endpoints: Annotated[int, Field(ge=0)] | None = Field(None, description="Endpoints that are ready.")
    total_endpoints: Annotated[int, Field(ge=0)] | None = Field(None, description="Endpoints found.")
    conditions: Annotated[list[Condition], CrdHint(list_map_keys=("type",))] = Field(
        default_factory=list, description="Ready, EndpointsReady and ServicesFound, by type."
    )
    observed_generation: int | None = None


class DynamoModel(_Model):
    """A model served on top of a namespace's graphs: a LoRA adapter loaded on every worker of its base
    model, or a base model whose workers are tracked."""

    api_version: Literal["nvidia.com/v1alpha1"] = API_VERSION
    kind: Literal["DynamoModel"] = KIND
    metadata: ObjectMeta
    spec: ModelSpec
    status: ModelStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or "default"


def is_relative_file(uri: str) -> bool:
    """``file://adapters/x`` or ``file://./adapters/x``: a path relative to the manifest's folder, which
    only dynamo-run can resolve (a worker pod has no such folder)."""
    return uri.startswith("file://") and not uri.removeprefix("file://").startswith("/")


def problems(dm: DynamoModel) -> tuple[Problem, ...]:
    """What is wrong with ``dm``'s spec beyond the schema, each naming the fix (empty: nothing)."""
    spec = dm.spec
    found: list[Problem] = []
    if spec.loads_adapter and (spec.source is None or not spec.source.uri.strip()):
        found.append(
            Problem(
                "spec.source.uri",
                "MissingSource",
                f"a {spec.model_type} model needs the adapter's files: set spec.source.uri "
                "(file:///path, hf://org/repo or s3://bucket/prefix), or set modelType: base",
            )
        )
    elif spec.loads_adapter and spec.source is not None and not spec.source.uri.startswith(SOURCE_SCHEMES):
        found.append(
            Problem(
                "spec.source.uri",
                "InvalidSource",
                f"{spec.source.uri!r} is not a supported source; write it as file:///path, "
                "hf://org/repo[@revision] or s3://bucket/prefix",
            )
        )
    if spec.loads_adapter and _NAME_SEPARATOR in spec.model_name:
        found.append(
            Problem(
                "spec.modelName",
                "InvalidName",
                f"{spec.model_name!r} contains ':', which requests use to write <base>:<adapter>; "
                "name the adapter without ':'",
            )
        )
    if spec.loads_adapter and spec.model_name == spec.base_model_name:
        found.append(
            Problem(
                "spec.modelName",
                "InvalidName",
                f"an adapter cannot be named like its base model ({spec.model_name!r}): requests for that "
                "name would be ambiguous; give the adapter a name of its own",
            )
        )
    return tuple(found)
