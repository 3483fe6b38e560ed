"""Pydantic models of ``nvidia.com/v1alpha1`` ``DynamoGraphDeployment``: the single source of truth.

This is also the operator's one internal model: ``render`` works from it whichever version a graph was
written in (:func:`dynamo_api.conversion.load_graph` reads both; v1beta1 lives in
:mod:`dynamo_api.v1beta1`).

The shape follows NVIDIA Dynamo's CRD, so a manifest written for Dynamo's operator parses here and
passes our generated schema (``crds/``, made by :mod:`dynamo_api.crdgen`). Fields Dynamo
accepts but this operator does not act on (``autoscaling``, ``ingress``, ``dynamoNamespace``, ...) are
declared and accepted; the renderer states in a Notice that it ignores them. (``modelRef`` names the
base model a worker serves, for ``DynamoModel``s: :mod:`dynamo_api.loras`.) Unknown fields are ignored
like the API server prunes them, except under ``extraPodSpec``, which is an arbitrary Kubernetes
PodSpec (plus ``mainContainer``, a Container) and is kept verbatim.

Parse the raw custom-object dict with ``DynamoGraphDeployment.model_validate(body)``; dump with
``model_dump(by_alias=True, exclude_none=True)`` to get the Kubernetes spelling back.

Annotations read by the operator (documented in ``examples/``):
``nvidia.com/rdma`` (graph or service: ``"true"`` wires pods for NIXL over RDMA),
``nvidia.com/rdma-host-network``, ``nvidia.com/ucx-tls``, ``nvidia.com/ucx-net-devices``,
``nvidia.com/dynamo-worker-module`` (graph: swap Dynamo's module names for ours).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "PVC",
    "SHORT_NAME",
    "SINGULAR",
    "STORAGE_API_VERSION",
    "STORAGE_VERSION",
    "VERSION",
    "Autoscaling",
    "ComponentType",
    "Condition",
    "Container",
    "CrdHint",
    "DynamoGraphDeployment",
    "EnvVar",
    "EnvVarSource",
    "ExtraPodMetadata",
    "ExtraPodSpec",
    "GraphPlacement",
    "GraphSpec",
    "GraphStatus",
    "Ingress",
    "ModelRef",
    "Multinode",
    "ObjectMeta",
    "Probe",
    "ResourceItem",
    "Resources",
    "ScalingAdapter",
    "ServicePlacement",
    "ServiceSpec",
    "ServiceStatus",
    "SharedMemory",
    "VolumeMount",
    "pack_domain",
]

# Final, and the apiVersions spelled out (GROUP/VERSION), so that their types are the literals the
# models' `apiVersion` and `kind` fields declare.
GROUP: Final = "nvidia.com"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "nvidia.com/v1alpha1"
# The version the API server stores (dynamo_api.v1beta1): what the operator watches and writes
# status to, and what ownerReferences name, so neither needs the conversion webhook.
STORAGE_VERSION: Final = "v1beta1"
STORAGE_API_VERSION: Final = "nvidia.com/v1beta1"
KIND: Final = "DynamoGraphDeployment"
PLURAL = "dynamographdeployments"
SINGULAR = "dynamographdeployment"
SHORT_NAME = "dgd"

# Dynamo's component types (its operator's consts); `main` is found in older manifests.
ComponentType = Literal["frontend", "worker", "prefill", "decode", "planner", "main", "epp", "default"]
SubComponentType = Literal["prefill", "decode"]
BackendFramework = Literal["sglang", "vllm", "trtllm"]


@dataclass(frozen=True)
class CrdHint:
    """How a field appears in the generated CRD schema beyond its Python type."""

    int_or_string: bool = False  # x-kubernetes-int-or-string (Kubernetes quantities, ports)
    preserve_unknown: bool = False  # x-kubernetes-preserve-unknown-fields: arbitrary content kept
    list_map_keys: tuple[str, ...] = ()  # x-kubernetes-list-type: map, merged by these keys


def _number_to_str(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a quantity like 1, '2', '500m' or '8Gi', not a boolean")
    return str(value) if isinstance(value, int | float) else value


# Kept as given (x-kubernetes-preserve-unknown-fields): Dynamo's shapes this operator reads at most a
# part of, or none (topologyConstraint, eppConfig, gpuMemoryService, ...).
Opaque = Annotated[dict[str, Any], CrdHint(preserve_unknown=True)]
# A Kubernetes quantity ("1", "500m", "8Gi"); YAML integers are accepted and kept as strings.
Quantity = Annotated[str, BeforeValidator(_number_to_str), CrdHint(int_or_string=True)]
IntOrString = Annotated[int | str, CrdHint(int_or_string=True)]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        frozen=True,
        protected_namespaces=(),
    )


class _Open(_Model):
    """A model whose unknown fields are kept (Kubernetes objects we pass through)."""

    model_config = ConfigDict(extra="allow")


def pack_domain(constraint: dict[str, Any] | None) -> str | None:
    """``topologyConstraint.packDomain``, when set."""
    domain = (constraint or {}).get("packDomain")
    return str(domain) if domain else None


# --- Kubernetes core types, as far as Dynamo's fields use them --------------------------------------


class KeyRef(_Model):
    name: str = Field(description="Name of the Secret or ConfigMap.")
    key: str = Field(description="The key to select.")
    optional: bool | None = Field(None, description="Whether the Secret/ConfigMap or key may be absent.")


class FieldRef(_Model):
    field_path: str = Field(description="Path of the pod field, e.g. metadata.name or status.podIP.")
    api_version: str | None = Field(None, description="Schema version of fieldPath, v1 by default.")


class ResourceFieldRef(_Model):
    resource: str = Field(description="Container resource, e.g. limits.cpu.")
    container_name: str | None = Field(None, description="Container name; this container by default.")
    divisor: Quantity | None = Field(None, description="Output format of the exposed resource.")


class EnvVarSource(_Model):
    secret_key_ref: KeyRef | None = Field(None, description="A key of a Secret.")
    config_map_key_ref: KeyRef | None = Field(None, description="A key of a ConfigMap.")
    field_ref: FieldRef | None = Field(None, description="A field of the pod (downward API).")
    resource_field_ref: ResourceFieldRef | None = Field(None, description="A container resource.")


class EnvVar(_Model):
    name: str = Field(description="Environment variable name.")
    value: str | None = Field(None, description="Literal value; $(VAR) references are expanded.")
    value_from: EnvVarSource | None = Field(None, description="Source of the value, instead of value.")


class HttpHeader(_Model):
    name: str
    value: str


class HttpGetAction(_Model):
    path: str | None = Field(None, description="HTTP path, e.g. /health.")
    port: IntOrString = Field(description="Port number or container port name.")
    host: str | None = None
    scheme: Literal["HTTP", "HTTPS"] | None = None
    http_headers: list[HttpHeader] | None = None


class TcpSocketAction(_Model):
    port: IntOrString
    host: str | None = None


class ExecAction(_Model):
    command: list[str] = Field(default_factory=list)


class GrpcAction(_Model):
    port: int
    service: str | None = None


class Probe(_Model):
    """A Kubernetes container probe (core/v1 Probe)."""

    http_get: HttpGetAction | None = None
    tcp_socket: TcpSocketAction | None = None
    exec: ExecAction | None = None
    grpc: GrpcAction | None = None
    initial_delay_seconds: Annotated[int, Field(ge=0)] | None = None
    period_seconds: Annotated[int, Field(ge=1)] | None = None
    timeout_seconds: Annotated[int, Field(ge=1)] | None = None
    success_threshold: Annotated[int, Field(ge=1)] | None = None
    failure_threshold: Annotated[int, Field(ge=1)] | None = None
    termination_grace_period_seconds: Annotated[int, Field(ge=1)] | None = None


class Container(_Open):
    """A Kubernetes Container (core/v1). Fields the operator reads are typed; the rest is kept."""

    name: str | None = Field(None, description="Ignored: the main container is always named main.")
    image: str | None = Field(None, description="Image; the operator's default image when unset.")
    command: list[str] | None = Field(None, description="Entrypoint; the component's default when unset.")
    args: list[str] | None = Field(None, description="Arguments to the entrypoint.")
    working_dir: str | None = None
    env: list[EnvVar] | None = Field(None, description="Env vars; these win over envs and the contract.")


class ExtraPodSpec(_Open):
    """A Kubernetes PodSpec merged over the generated one, plus the main container's overrides."""

    main_container: Container | None = Field(
        None, description="Merged over the generated main container: command, args and image win."
    )


class ExtraPodMetadata(_Model):
    annotations: dict[str, str] = Field(default_factory=dict, description="Added to the pods.")
    labels: dict[str, str] = Field(default_factory=dict, description="Added to the pods.")


# --- Dynamo's types ------------------------------------------------------------------------------


class ResourceItem(_Model):
    cpu: Quantity | None = Field(None, description="CPU, e.g. '2' or '500m'.")
    memory: Quantity | None = Field(None, description="Memory, e.g. '16Gi'.")
    gpu: Quantity | None = Field(None, description="GPUs per pod; for multinode, per pod of a group.")
    gpu_type: str | None = Field(None, description="GPU resource name, nvidia.com/gpu by default.")
    custom: dict[str, Quantity] = Field(
        default_factory=dict, description="Other resources, passed through (e.g. rdma/ib, ephemeral-storage)."
    )


class ResourceClaim(_Model):
    name: str
    request: str | None = None


class Resources(_Model):
    requests: ResourceItem | None = None
    limits: ResourceItem | None = None
    claims: list[ResourceClaim] | None = Field(None, description="Dynamic resource allocation claims.")


class Multinode(_Model):
    node_count: Annotated[int, Field(ge=2)] = Field(
        2, description="Pods per replica; one engine spans them (total GPUs = nodeCount x gpu)."
    )


class SharedMemory(_Model):
    disabled: bool = Field(False, description="No /dev/shm volume when true.")
    size: Quantity | None = Field(None, description="Size of the /dev/shm tmpfs; 8Gi by default.")


class VolumeMount(_Model):
    name: str = Field(description="Name of a PVC in spec.pvcs.")
    mount_point: str | None = Field(None, description="Where the volume is mounted in the main container.")
    use_as_compilation_cache: bool = Field(False, description="Accepted; not used for SGLang.")


class PVC(_Model):
    name: str | None = Field(None, description="Name of the PersistentVolumeClaim.")
    create: bool | None = Field(None, description="Create the claim (needs size, storageClass, access mode).")
    storage_class: str | None = None
    size: Quantity | None = None
    volume_access_mode: str | None = None
    mount_point: str | None = Field(None, description="Older Dynamo manifests: where to mount it.")


class Autoscaling(_Model):
    """Deprecated in Dynamo and ignored here (accepted for compatibility)."""

    enabled: bool | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    behavior: Annotated[dict[str, Any], CrdHint(preserve_unknown=True)] | None = None
    metrics: list[Annotated[dict[str, Any], CrdHint(preserve_unknown=True)]] | None = None


class IngressTls(_Model):
    secret_name: str | None = None


class Ingress(_Model):
    """Accepted for compatibility; this operator creates no Ingress."""

    enabled: bool | None = None
    host: str | None = None
    use_virtual_service: bool | None = None
    virtual_service_gateway: str | None = None
    host_prefix: str | None = None
    host_suffix: str | None = None
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    tls: IngressTls | None = None
    ingress_controller_class_name: str | None = None


class ModelRef(_Model):
    name: str
    revision: str | None = None


class ScalingAdapter(_Model):
    """Whether the service gets a DynamoGraphDeploymentScalingAdapter (dgdsa): the target of HPA, KEDA
    and ``kubectl scale``, and then the owner of the service's replicas."""

    enabled: bool = Field(
        False, description="Create an adapter <graph>-<service>; its spec.replicas sets this service's."
    )


class ServiceSpec(_Model):
    """One entry of ``spec.services``: a component of the graph."""

    component_type: ComponentType | None = Field(
        None,
        description="frontend, worker, prefill, decode, epp (endpoint picker); planner, main, default: as is",
    )
    sub_component_type: SubComponentType | None = Field(
        None, description="prefill or decode for a disaggregated worker."
    )
    replicas: Annotated[int, Field(ge=0)] = Field(1, description="Pods, or groups of pods when multinode.")
    multinode: Multinode | None = Field(None, description="Run one engine over nodeCount pods per replica.")
    resources: Resources | None = None
    envs: list[EnvVar] = Field(default_factory=list, description="Env vars; win over spec.envs.")
    env_from_secret: str | None = Field(None, description="A Secret whose keys become env vars.")
    extra_pod_spec: Annotated[ExtraPodSpec, CrdHint(preserve_unknown=True)] | None = None
    extra_pod_metadata: ExtraPodMetadata | None = None
    shared_memory: SharedMemory | None = None
    volume_mounts: list[VolumeMount] = Field(default_factory=list)
    liveness_probe: Probe | None = Field(None, description="Replaces the default liveness probe.")
    readiness_probe: Probe | None = Field(None, description="Replaces the default readiness probe.")
    scaling_adapter: ScalingAdapter | None = Field(
        None, description="enabled: true lets HPA, KEDA or kubectl scale set replicas through an adapter."
    )
    annotations: dict[str, str] = Field(default_factory=dict, description="Added to generated objects.")
    labels: dict[str, str] = Field(default_factory=dict, description="Added to generated objects.")
    topology_constraint: Opaque | None = Field(
        None,
        description="packDomain: the service's pods (a multinode group's, per group) in one topology domain, "
        "a node label the operator knows (--topology-domains).",
    )
    # Accepted for compatibility with Dynamo; not acted on (the renderer says so in a Notice).
    service_name: str | None = Field(None, description="Ignored (Dynamo: the component name).")
    dynamo_namespace: str | None = Field(None, description="Ignored: <namespace>-<graph name> is used.")
    global_dynamo_namespace: bool | None = Field(None, description="Not supported; ignored.")
    autoscaling: Autoscaling | None = None
    ingress: Ingress | None = None
    model_ref: ModelRef | None = Field(
        None, description="The base model this worker serves, for DynamoModels (LoRA adapters) naming it."
    )
    pvc: PVC | None = Field(None, description="Older Dynamo manifests: one volume for this service.")
    epp_config: Opaque | None = Field(
        None, description="Dynamo's EPP plugin configuration; ignored (an epp service's picker takes flags)."
    )
    gpu_memory_service: Opaque | None = Field(
        None, description="Not supported (Dynamo's GPU Memory Service sidecar); ignored."
    )

    @property
    def node_count(self) -> int:
        return self.multinode.node_count if self.multinode else 1

    @property
    def pack_domain(self) -> str | None:
        return pack_domain(self.topology_constraint)


class GraphSpec(_Model):
    services: dict[str, ServiceSpec] = Field(default_factory=dict, description="Service name -> component.")
    envs: list[EnvVar] = Field(default_factory=list, description="Env vars for every service.")
    backend_framework: BackendFramework = Field(
        "sglang", description="sglang, the only backend this operator renders (the default)."
    )
    pvcs: list[PVC] = Field(default_factory=list, description="Volumes services mount by name.")
    dynamo_graph: str | None = Field(None, description="Ignored (older Dynamo manifests).")
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Added to every generated object and pod; a service's own win."
    )
    labels: dict[str, str] = Field(
        default_factory=dict, description="Added to every generated object and pod; a service's own win."
    )
    priority_class_name: str | None = Field(
        None, description="The PriorityClass of every pod whose extraPodSpec sets none."
    )
    topology_constraint: Opaque | None = Field(
        None,
        description="packDomain: every pod of the graph in one topology domain, a node label the operator "
        "knows (--topology-domains); topologyProfile (Dynamo's ClusterTopology) is not used.",
    )

    @property
    def pack_domain(self) -> str | None:
        return pack_domain(self.topology_constraint)


# --- status ----------------------------------------------------------------------------------------


class Condition(_Model):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None
    observed_generation: int | None = None


class ServiceStatus(_Model):
    component_kind: str | None = Field(None, description="Deployment, StatefulSet or LeaderWorkerSet.")
    component_name: str | None = Field(None, description="The child's name (the first, for groups).")
    component_names: list[str] | None = Field(None, description="Every child, for multinode groups.")
    replicas: Annotated[int, Field(ge=0)] | None = Field(None, description="Pods (or groups) that exist.")
    ready_replicas: Annotated[int, Field(ge=0)] | None = Field(None, description="Ready pods or groups.")
    updated_replicas: Annotated[int, Field(ge=0)] | None = None
    available_replicas: Annotated[int, Field(ge=0)] | None = None


class GraphStatus(_Model):
    state: str | None = Field(None, description="pending, successful or failed.")
    conditions: Annotated[list[Condition], CrdHint(list_map_keys=("type",))] = Field(
        default_factory=list, description="Ready (with an actionable reason) and others, by type."
    )
    services: dict[str, ServiceStatus] = Field(default_factory=dict)
    observed_generation: int | None = None
    group_backend: Literal["lws", "statefulset"] | None = Field(
        None, description="What multinode groups are made of: LeaderWorkerSet or StatefulSet."
    )


class ObjectMeta(_Open):
    """Kubernetes object metadata; dict-style access (``meta["name"]``, ``meta.get("uid")``) works too."""

    name: str
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        dumped = self.model_dump(by_alias=True)
        return dumped[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.model_dump(by_alias=True).get(key, default)


# --- v1beta1 fields the internal model carries beside its v1alpha1 spec -----------------------------


class ServicePlacement(_Model):
    """What a v1beta1 component says that v1alpha1 has no place for, read by ``render`` (filled by
    :func:`dynamo_api.conversion.load_graph`; empty for a plain v1alpha1 manifest)."""

    min_available: int | None = None  # replicas (groups, when multinode) started as one gang
    dynamo_sidecar: str | None = None
    frontend_sidecar: str | None = None
    ignored: tuple[str, ...] = ()  # fields that are set and not acted on, by name


class GraphPlacement(_Model):
    """The graph-level v1beta1 fields v1alpha1 has no place for, and each component's."""

    ignored: tuple[str, ...] = ()
    services: dict[str, ServicePlacement] = Field(default_factory=dict)

    def service(self, name: str) -> ServicePlacement:
        return self.services.get(name) or ServicePlacement()


class DynamoGraphDeployment(_Model):
    api_version: Literal["nvidia.com/v1alpha1"] = API_VERSION
    kind: Literal["DynamoGraphDeployment"] = KIND
    metadata: ObjectMeta
    spec: GraphSpec = Field(default_factory=GraphSpec)
    status: GraphStatus | None = None
    # Not part of the manifest (never dumped): the v1beta1-only fields, see GraphPlacement.
    v1beta1: GraphPlacement = Field(default_factory=GraphPlacement, exclude=True)

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or "default"

    @property
    def dynamo_namespace(self) -> str:
        """The discovery/event scope of this graph's pods: ``<k8s-namespace>-<name>``."""
        return f"{self.namespace}-{self.name}"
