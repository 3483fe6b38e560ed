"""Pydantic models of ``nvidia.com/v1beta1`` ``DynamoGraphDeployment``, the stored version.

The shape is NVIDIA Dynamo's v1beta1: ``spec.components`` is a list of components, each with a unique
``name``, a ``type`` (frontend, worker, prefill, decode, planner, epp), ``replicas`` and a
``podTemplate`` (a Kubernetes PodTemplateSpec whose container named ``main`` runs the component);
``spec.env`` is prepended to every component's environment. Fields Dynamo accepts and this operator does
not act on (``providerOverride``, ``topologyConstraint``, ``experimental``, ``restart``, ``roles``,
``eppConfig``, ...) are declared and kept as given. ``scalingAdapter`` opts a component into a
DynamoGraphDeploymentScalingAdapter by being there (Dynamo's v1beta1 marker, ``{}``); ``{enabled:
false}``, the shape of earlier Dynamo releases, opts out.

The status schema is the one of v1alpha1 (:class:`dynamo_api.models.GraphStatus`): both
versions share it, so status reads the same whichever version a client asks for.

The operator renders from one internal model, the v1alpha1 one: :func:`dynamo_api.conversion.
load_graph` turns a raw manifest of either version into it.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field

from dynamo_api.models import (
    KIND,
    STORAGE_API_VERSION,
    STORAGE_VERSION,
    BackendFramework,
    CrdHint,
    EnvVar,
    GraphStatus,
    ModelRef,
    Multinode,
    ObjectMeta,
    Opaque,
    Quantity,
    _Model,
)

__all__ = [
    "API_VERSION",
    "MAIN_CONTAINER",
    "VERSION",
    "CompilationCache",
    "ComponentSpec",
    "ComponentType",
    "DynamoGraphDeployment",
    "GraphSpec",
]

VERSION: Final = STORAGE_VERSION
API_VERSION: Final = STORAGE_API_VERSION
MAIN_CONTAINER = "main"  # the container of podTemplate that runs the component

ComponentType = Literal["frontend", "worker", "prefill", "decode", "planner", "epp"]

# Kept as given (x-kubernetes-preserve-unknown-fields): Dynamo's shapes the operator does not act on.
_Opaque = Opaque


class CompilationCache(_Model):
    pvc_name: str | None = Field(None, description="Accepted; not used for SGLang.")
    mount_path: str | None = Field(None, description="Accepted; not used for SGLang.")


class ComponentSpec(_Model):
    """One entry of ``spec.components``: a component of the graph."""

    name: str = Field(description="The component's name, unique in the graph (the v1alpha1 services key).")
    type: ComponentType | None = Field(
        None, description="frontend, worker, prefill, decode, epp (endpoint picker); planner: run as given."
    )
    replicas: Annotated[int, Field(ge=0)] | None = Field(
        None, description="Pods, or groups of pods when multinode; 1 when unset."
    )
    pod_template: _Opaque | None = Field(
        None,
        description="A PodTemplateSpec: the container named main runs the component (image, command, "
        "args, env, envFrom, resources with nvidia.com/gpu, probes); other containers are sidecars.",
    )
    multinode: Multinode | None = Field(None, description="Run one engine over nodeCount pods per replica.")
    shared_memory_size: Quantity | None = Field(
        None, description="Size of the /dev/shm tmpfs; 8Gi when unset, '0' for no /dev/shm."
    )
    model_ref: ModelRef | None = None
    global_dynamo_namespace: bool | None = Field(None, description="Not supported; ignored.")
    # Accepted for compatibility with Dynamo; not acted on (except scalingAdapter).
    runtime_version_override: str | None = None
    min_available: Annotated[int, Field(ge=1)] | None = None
    roles: list[_Opaque] | None = None
    scaling_adapter: _Opaque | None = Field(
        None,
        description="Present ({}) to scale this component through a DynamoGraphDeploymentScalingAdapter "
        "(HPA, KEDA, kubectl scale); {enabled: false} opts out.",
    )
    epp_config: _Opaque | None = None
    frontend_sidecar: str | None = None
    dynamo_sidecar: str | None = None
    compilation_cache: CompilationCache | None = None
    topology_constraint: _Opaque | None = None
    experimental: _Opaque | None = None
    provider_override: _Opaque | None = None


class GraphSpec(_Model):
    components: Annotated[list[ComponentSpec], CrdHint(list_map_keys=("name",))] = Field(
        default_factory=list, description="The components of the graph, by unique name."
    )
    env: list[EnvVar] = Field(
        default_factory=list, description="Prepended to every component's env (its own entries win)."
    )
    backend_framework: BackendFramework = Field(
        "sglang", description="sglang, the only backend this operator renders (the default)."
    )
    # Accepted for compatibility with Dynamo; not acted on.
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    priority_class_name: str | None = None
    restart: _Opaque | None = None
    topology_constraint: _Opaque | None = None
    experimental: _Opaque | None = None
    provider_override: _Opaque | None = None


class DynamoGraphDeployment(_Model):
    api_version: Literal["nvidia.com/v1beta1"] = API_VERSION
    kind: Literal["DynamoGraphDeployment"] = KIND
    metadata: ObjectMeta
    spec: GraphSpec = Field(default_factory=GraphSpec)
    status: GraphStatus | None = None
