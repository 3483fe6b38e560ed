"""``OperatorConfig``: everything besides the DynamoGraphDeployment that decides the rendered objects.

A frozen, typed model with help text on every field. It reads no environment itself:
``dynamo_operator.settings.OperatorSettings`` derives from it (so each field here is also a flag and an
environment variable, declared once) and builds it once the group backend is known; tests build it
directly. Two equal configs render byte-identical objects from one DGD.
"""

from __future__ import annotations

from typing import Annotated, Literal

from dynamo_api.contract import DEFAULT_DISCOVERY_TTL_S, NATS_PORT
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DEFAULT_IMAGE", "DEFAULT_TOPOLOGY_DOMAINS", "GANG_SCHEDULER_NAME", "OperatorConfig"]

# The one image that runs every role of the graph (frontend, workers, mocker): images/runtime, tagged
# with the project version (the chart's appVersion). Pinned, never :latest.
DEFAULT_IMAGE = "dynamo-sglang/runtime:0.1.0"
# The schedulerName scheduler-plugins' own chart gives its second scheduler (coscheduling enabled).
GANG_SCHEDULER_NAME = "scheduler-plugins-scheduler"
# Pack domains (a graph's topologyConstraint.packDomain) -> the node label whose value is one domain:
# the well-known labels; add rack, block, ... with the labels your nodes carry.
DEFAULT_TOPOLOGY_DOMAINS = {
    "region": "topology.kubernetes.io/region",
    "zone": "topology.kubernetes.io/zone",
    "host": "kubernetes.io/hostname",
}


class OperatorConfig(BaseModel):
    """Operator-wide settings that shape the pods of every graph."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nats_url: str = Field(
        f"nats://nats:{NATS_PORT}",
        description="NATS server the pods use for discovery and events (NATS_SERVER in every pod).",
    )
    frontend_image: str = Field(DEFAULT_IMAGE, description="Image for frontend services that set none.")
    worker_image: str = Field(DEFAULT_IMAGE, description="Image for worker services that set none.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="imagePullPolicy of the generated main containers."
    )
    group_backend: Literal["lws", "statefulset"] = Field(
        "statefulset",
        description="Multinode groups: one LeaderWorkerSet per replica (needs the LWS CRD), "
        "or a leader StatefulSet + a worker StatefulSet + a headless Service per replica.",
    )
    rdma_resource_name: str = Field(
        "rdma/ib", description="Extended resource that gives a pod an RDMA device (RDMA-enabled services)."
    )
    rdma_resource_count: Annotated[int, Field(ge=1)] = Field(
        1, description="How many RDMA devices an RDMA-enabled pod asks for."
    )
    ucx_tls: str = Field(
        "rc,cuda_copy,cuda_ipc",
        description="UCX_TLS for RDMA-enabled pods (annotation nvidia.com/ucx-tls wins).",
    )
    default_shm_size: str = Field("8Gi", description="Size of /dev/shm when sharedMemory.size is unset.")
    startup_timeout_s: Annotated[int, Field(ge=60)] = Field(
        3600, description="How long a worker may take to load its model before its startup probe fails."
    )
    discovery_ttl_s: Annotated[float, Field(gt=0)] = Field(
        DEFAULT_DISCOVERY_TTL_S, description="Seconds a worker's registration lives without a heartbeat."
    )
    pod_log_format: Literal["json", "text"] = Field("json", description="DYN_LOG_FORMAT in the pods.")
    frontend_api_key_secret: str | None = Field(
        None,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="A Secret, in the namespace of each graph, whose key --frontend-api-key-secret-key every "
        "frontend pod reads as DYN_API_KEY (secretKeyRef), so that every frontend requires that API key; a "
        "graph that sets DYN_API_KEY on its frontend itself keeps its own. Unset: only such graphs do.",
    )
    frontend_api_key_secret_key: str = Field(
        "api-key",
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="The key of --frontend-api-key-secret that holds the API key.",
    )
    gang_scheduler: Literal["coscheduling", "none"] = Field(
        "none",
        description="Who starts a graph's gangs (services with minAvailable, every multinode group) all at "
        "once or not at all: scheduler-plugins' coscheduling plugin (PodGroups), or none.",
    )
    gang_scheduler_name: str = Field(
        GANG_SCHEDULER_NAME, description="schedulerName of the scheduler that runs the coscheduling plugin."
    )
    topology_domains: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_TOPOLOGY_DOMAINS),
        description="topologyConstraint.packDomain -> the node label whose value names one such domain; "
        "NAME=LABEL entries or a JSON object, added to region, zone and host (e.g. rack=example.com/rack).",
    )
