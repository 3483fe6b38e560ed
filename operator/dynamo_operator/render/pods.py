"""The main container and pod template of a service: env contract, resources, volumes, probes, merges."""

from __future__ import annotations

import math
from typing import Any

from dynamo_api import contract, modules
from dynamo_api.annotations import MODULE_ANNOTATION, RDMA_ANNOTATION, parse_bool
from dynamo_api.components import Component, components
from dynamo_api.frontend_args import picker_router_mode, router_mode
from dynamo_api.models import STORAGE_API_VERSION, DynamoGraphDeployment, EnvVar, Probe, ResourceItem
from dynamo_api.sglang_args import argv

from dynamo_operator.backends import nixl, sglang
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import labels
from dynamo_operator.render.merge import merge
from dynamo_operator.render.names import frontend_pods_service
from dynamo_operator.render.revision import graph_models
from dynamo_operator.render.types import Notice

__all__ = [
    "GPU_RESOURCE",
    "SHM_VOLUME",
    "bootstrap_port",
    "contract_env",
    "has_picker",
    "main_container",
    "object_meta",
    "pod_spec",
    "rdma_settings",
    "routes_on_kv",
    "template",
]

GPU_RESOURCE = "nvidia.com/gpu"
SHM_VOLUME = "shared-memory"
_PROBE_PERIOD_S = 10
# A frontend process on a busy node (2 cores starting a graph's pods at once) took over 30 s to listen,
# and liveness (3 x 10 s) restarted it mid-start: liveness waits until it has answered once.
FRONTEND_STARTUP_S = 120


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def contract_env(
    dgd: DynamoGraphDeployment, c: Component, config: OperatorConfig, revision: str | None = None
) -> list[dict[str, Any]]:
    """The env every pod of the graph gets (names from ``contract.py``); a frontend also gets the graph's
    models and, when the operator is configured with one, its API key Secret; the prefill and decode pods
    of a disaggregated graph get their ``revision``."""
    env = [
        _field_env(contract.ENV_POD_NAME, "metadata.name"),
        _field_env(contract.ENV_POD_NAMESPACE, "metadata.namespace"),
        _field_env(contract.ENV_POD_IP, "status.podIP"),
        {"name": contract.ENV_NAMESPACE, "value": dgd.dynamo_namespace},
        {"name": contract.ENV_COMPONENT, "value": c.name},
        {"name": contract.ENV_GRAPH_NAME, "value": dgd.name},
        {"name": contract.ENV_GRAPH_NAMESPACE, "value": dgd.namespace},
        {"name": contract.ENV_NATS_SERVER, "value": config.nats_url},
        {"name": contract.ENV_DISCOVERY_TTL, "value": f"{config.discovery_ttl_s:g}"},
        {"name": contract.ENV_LOG_FORMAT, "value": config.pod_log_format},
    ]
    if c.kind == "frontend":
        env.append({"name": contract.ENV_HTTP_PORT, "value": str(contract.FRONTEND_PORT)})
        models = graph_models(components(dgd))
        if models:
            env.append({"name": contract.ENV_GRAPH_MODELS, "value": ",".join(models)})
        if config.frontend_api_key_secret:
            ref = {"name": config.frontend_api_key_secret, "key": config.frontend_api_key_secret_key}
            env.append({"name": contract.ENV_API_KEY, "valueFrom": {"secretKeyRef": ref}})
    else:
        if c.kind == "epp":
            env.append({"name": contract.ENV_EPP_FRONTENDS, "value": _frontends(dgd)})
        env += [
            {"name": contract.ENV_SYSTEM_ENABLED, "value": "true"},
            {"name": contract.ENV_SYSTEM_PORT, "value": str(contract.SYSTEM_PORT)},
        ]
    if c.kind == "worker":
        env += [
            {"name": contract.ENV_ENDPOINT, "value": contract.DEFAULT_ENDPOINT},
            {"name": contract.ENV_REQUEST_PORT, "value": str(contract.REQUEST_PORT)},
            {"name": contract.ENV_ADVERTISE_HOST, "value": f"$({contract.ENV_POD_IP})"},
        ]
        if revision is not None and c.role in ("prefill", "decode"):
            env.append({"name": contract.ENV_REVISION, "value": revision})
    return env


def _frontends(dgd: DynamoGraphDeployment) -> str:
    """An endpoint picker's --frontends: the headless Service of each frontend of the graph."""
    return ",".join(
        f"{frontend_pods_service(dgd.name, f.name)}:{contract.FRONTEND_PORT}"
        for f in components(dgd)
        if f.kind == "frontend"
    )


def has_picker(dgd: DynamoGraphDeployment) -> bool:
    """Whether the graph has an endpoint picker (componentType epp), which routes for its frontends."""
    return any(c.kind == "epp" for c in components(dgd))


def _dump_env(envs: list[EnvVar]) -> list[dict[str, Any]]:
    return [e.model_dump(by_alias=True, exclude_none=True) for e in envs]


def _merge_env(*lists: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Later lists win by name; each name keeps the position where it first appeared."""
    merged: dict[str, dict[str, Any]] = {}
    for env in lists:
        for item in env:
            merged[item["name"]] = item
    return list(merged.values())


def _resource_map(item: ResourceItem | None, gpu_name: str) -> dict[str, str]:
    if item is None:
        return {}
    out: dict[str, str] = {}
    if item.cpu is not None:
        out["cpu"] = item.cpu
    if item.memory is not None:
        out["memory"] = item.memory
    if item.gpu is not None:
        out[item.gpu_type or gpu_name] = item.gpu
    out.update(item.custom)
    return out


def _resources(c: Component) -> dict[str, Any]:
    spec = c.spec.resources
    if spec is None:
        return {}
    gpu_name = (spec.limits and spec.limits.gpu_type) or (spec.requests and spec.requests.gpu_type)
    gpu_name = gpu_name or GPU_RESOURCE
    limits = _resource_map(spec.limits, gpu_name)
    requests = _resource_map(spec.requests, gpu_name)
    if spec.requests is not None and spec.requests.gpu is not None and gpu_name not in limits:
        limits[gpu_name] = spec.requests.gpu  # extended resources need a limit
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    if spec.claims:
        out["claims"] = [claim.model_dump(by_alias=True, exclude_none=True) for claim in spec.claims]
    return out


def _http_probe(path: str, port: str, failure: int, timeout: int = 5) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": _PROBE_PERIOD_S,
        "timeoutSeconds": timeout,
        "failureThreshold": failure,
    }


def _dump_probe(probe: Probe) -> dict[str, Any]:
    return probe.model_dump(by_alias=True, exclude_none=True)


def _probes(c: Component, config: OperatorConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if c.kind == "frontend":
        out["livenessProbe"] = _http_probe(contract.LIVE_PATH, "http", 3)
        out["readinessProbe"] = _http_probe(contract.HEALTH_PATH, "http", 3)
        failures = math.ceil(FRONTEND_STARTUP_S / _PROBE_PERIOD_S)
        out["startupProbe"] = _http_probe(contract.LIVE_PATH, "http", failures)
    elif c.kind == "epp":  # ready (/health) once it can serve a model; gRPC health says the same
        out["livenessProbe"] = _http_probe(contract.LIVE_PATH, "system", 3)
        out["readinessProbe"] = _http_probe(contract.HEALTH_PATH, "system", 3)
    elif c.kind == "worker":
        out["livenessProbe"] = _http_probe(contract.LIVE_PATH, "system", 3)
        out["readinessProbe"] = _http_probe(contract.HEALTH_PATH, "system", 3)
        # Model loading takes minutes: liveness only starts once the worker is healthy.
        failures = math.ceil(config.startup_timeout_s / _PROBE_PERIOD_S)
        out["startupProbe"] = _http_probe(contract.HEALTH_PATH, "system", failures)
    if c.spec.liveness_probe is not None:
        out["livenessProbe"] = _dump_probe(c.spec.liveness_probe)
    if c.spec.readiness_probe is not None:
        out["readinessProbe"] = _dump_probe(c.spec.readiness_probe)
    return out


def bootstrap_port(c: Component) -> int:
    port = c.args.bootstrap_port
    return int(port) if port else contract.DEFAULT_BOOTSTRAP_PORT


def _ports(c: Component) -> list[dict[str, Any]]:
    if c.kind == "frontend":
        return [{"name": "http", "containerPort": contract.FRONTEND_PORT, "protocol": "TCP"}]
    ports = [{"name": "system", "containerPort": contract.SYSTEM_PORT, "protocol": "TCP"}]
    if c.kind == "epp":
        grpc = {"name": contract.EPP_PORT_NAME, "containerPort": contract.EPP_PORT, "protocol": "TCP"}
        ports.insert(0, grpc)
    if c.kind == "worker":
        ports.append({"name": "request", "containerPort": contract.REQUEST_PORT, "protocol": "TCP"})
        if c.role == "prefill":
            ports.append({"name": "bootstrap", "containerPort": bootstrap_port(c), "protocol": "TCP"})
    return ports


def _mounts(dgd: DynamoGraphDeployment, c: Component) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = []
    if not (c.spec.shared_memory and c.spec.shared_memory.disabled):
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    for mount in c.spec.volume_mounts:
        mounts.append({"name": mount.name, "mountPath": mount.mount_point})
    if c.spec.pvc is not None and c.spec.pvc.name and c.spec.pvc.mount_point:
        mounts.append({"name": c.spec.pvc.name, "mountPath": c.spec.pvc.mount_point})
    return mounts


def _volumes(dgd: DynamoGraphDeployment, c: Component, config: OperatorConfig) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = []
    shm = c.spec.shared_memory
    if not (shm and shm.disabled):
        size = (shm.size if shm else None) or config.default_shm_size
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": size}})
    claimed = [m.name for m in c.spec.volume_mounts]
    if c.spec.pvc is not None and c.spec.pvc.name and c.spec.pvc.mount_point:
        claimed.append(c.spec.pvc.name)
    for name in dict.fromkeys(claimed):
        volumes.append({"name": name, "persistentVolumeClaim": {"claimName": name}})
    return volumes


def _annotation(dgd: DynamoGraphDeployment, c: Component, key: str) -> str | None:
    return c.spec.annotations.get(key, dgd.metadata.annotations.get(key))


def main_container(
    dgd: DynamoGraphDeployment, c: Component, config: OperatorConfig, revision: str | None = None
) -> tuple[dict[str, Any], list[Notice]]:
    """The ``main`` container before multinode flags: ours, the user's mainContainer merged over it,
    then the engine's command made to fit the graph (each step may say so in a notice).
    ``revision``: the graph's prefill/decode revision (``render.revision``)."""
    container = _merge_user(c, _our_container(dgd, c, config, revision))
    notices: list[Notice] = []
    steps = (_swap_module, _route_direct, _declare_bootstrap_port, _listen_for_peers, _publish_kv_events)
    for step in steps:
        container, notice = step(dgd, c, container)
        if notice is not None:
            notices.append(notice)
    return container, notices


def _our_container(
    dgd: DynamoGraphDeployment, c: Component, config: OperatorConfig, revision: str | None
) -> dict[str, Any]:
    """The container the operator writes: image, the component's command, the env contract (then the
    graph's env, then the service's), ports, resources, mounts, probes, the env secret."""
    image = config.frontend_image if c.kind in ("frontend", "epp") else config.worker_image
    ours: dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": config.image_pull_policy,
        "command": list(c.command_view["command"]),
        "args": [],
        "env": _merge_env(
            contract_env(dgd, c, config, revision), _dump_env(dgd.spec.envs), _dump_env(c.spec.envs)
        ),
        "ports": _ports(c),
        "resources": _resources(c),
        "volumeMounts": _mounts(dgd, c),
        **_probes(c, config),
    }
    if c.spec.env_from_secret:
        ours["envFrom"] = [{"secretRef": {"name": c.spec.env_from_secret}}]
    return ours


def _merge_user(c: Component, ours: dict[str, Any]) -> dict[str, Any]:
    """The user's mainContainer merged over ``ours``; an empty command, args or resources left out."""
    user = {k: v for k, v in c.user_container.items() if k != "name"}
    container = merge(ours, user)
    for key in ("command", "args", "resources"):
        if not container.get(key):
            container.pop(key, None)
    return container


# The steps that fit the engine's command to the graph: each takes the container and gives it back,
# with a notice when it changed what the user wrote.
_Step = tuple[dict[str, Any], Notice | None]


def _swap_module(dgd: DynamoGraphDeployment, c: Component, container: dict[str, Any]) -> _Step:
    """The module annotation names the engine a worker runs; a frontend runs our counterpart of Dynamo's."""
    module = _annotation(dgd, c, MODULE_ANNOTATION)
    if module is None or c.kind not in ("frontend", "worker"):
        return container, None
    old = modules.DYNAMO_FRONTEND_MODULE if c.kind == "frontend" else modules.DYNAMO_SGLANG_MODULE
    new = modules.DYNAMO_ALIASES[old] if c.kind == "frontend" else module
    container, swapped = sglang.swap_module(container, old, new)
    if not swapped:
        return container, None
    return container, Notice(
        "ModuleSwapped", f"Service {c.name!r} runs -m {new} instead of -m {old}.", c.name
    )


def _route_direct(dgd: DynamoGraphDeployment, c: Component, container: dict[str, Any]) -> _Step:
    """A frontend behind the graph's endpoint picker serves the workers the picker named."""
    if c.kind != "frontend" or not has_picker(dgd):
        return container, None
    container, previous = sglang.ensure_flag(container, contract.ROUTER_MODE_FLAG, "direct")
    if previous in (None, "direct"):
        return container, None
    return container, Notice(
        "RouterModeOverridden",
        f"Service {c.name!r} set {contract.ROUTER_MODE_FLAG} {previous}; it runs "
        f"{contract.ROUTER_MODE_FLAG} direct, since the graph's endpoint picker routes its requests "
        f"(set {contract.ROUTER_MODE_FLAG} on the picker instead).",
        c.name,
        warning=True,
    )


def _declare_bootstrap_port(dgd: DynamoGraphDeployment, c: Component, container: dict[str, Any]) -> _Step:
    """A prefill worker binds the port it declares: SGLang's default, made explicit (contract.py)."""
    if c.kind == "worker" and c.role == "prefill" and not c.args.bootstrap_port:
        container, _ = sglang.ensure_flag(container, contract.BOOTSTRAP_PORT_FLAG, str(bootstrap_port(c)))
    return container, None


def _listen_for_peers(dgd: DynamoGraphDeployment, c: Component, container: dict[str, Any]) -> _Step:
    """A prefill or decode worker listens on every address, so that its disaggregation peers reach it."""
    if c.kind != "worker" or c.role not in ("prefill", "decode"):
        return container, None
    container, previous = sglang.ensure_flag(container, "--host", "0.0.0.0")
    if previous is None:
        return container, None
    return container, Notice(
        "HostOverridden",
        f"Service {c.name!r} listened on --host {previous}; it now uses --host 0.0.0.0 so its "
        "disaggregation peers can reach it.",
        c.name,
        warning=True,
    )


def _publish_kv_events(dgd: DynamoGraphDeployment, c: Component, container: dict[str, Any]) -> _Step:
    """A worker of a graph whose frontend routes on KV cache publishes its KV events."""
    if c.kind != "worker" or not routes_on_kv(dgd):
        return container, None
    container, problem = sglang.wire_kv_events(container, c.args.dp or 1)
    if problem is None:
        return container, None
    return container, Notice(
        "NoKvEvents",
        f"Service {c.name!r} sets {contract.KV_EVENTS_FLAG} that {problem}, while the graph's "
        f"frontend routes on KV cache ({contract.ROUTER_MODE_FLAG} kv): the router cannot see "
        f"this worker's cache. Remove the flag (the operator then wires a publisher) or set "
        f'"publisher": "zmq".',
        c.name,
        warning=True,
    )


def routes_on_kv(dgd: DynamoGraphDeployment) -> bool:
    """Whether a frontend of the graph routes on KV cache: its command and env (the graph's, the
    service's, then its mainContainer's, as ``main_container`` merges them; the contract's sets no router
    mode) read as the frontend reads them (``frontend_args.router_mode``); in a graph with an endpoint
    picker, whether the picker does (``frontend_args.picker_router_mode``)."""
    for c in components(dgd):
        if c.kind == "epp":  # the picker routes for the frontends, which run --router-mode direct
            return picker_router_mode(argv(c.command_view)) == "kv"
    for c in components(dgd):
        if c.kind != "frontend":
            continue
        env = {e.name: e.value for e in [*dgd.spec.envs, *c.spec.envs]}
        for item in c.user_container.get("env") or []:
            env[item.get("name")] = item.get("value")
        if router_mode(argv(c.command_view), env) == "kv":
            return True
    return False


def rdma_settings(
    dgd: DynamoGraphDeployment, c: Component, config: OperatorConfig
) -> nixl.RdmaSettings | None:
    """RDMA settings when this service is RDMA-enabled (annotation on the service or the graph)."""
    if c.kind != "worker":
        return None
    enabled = parse_bool(_annotation(dgd, c, RDMA_ANNOTATION))
    if not enabled:
        return None
    return nixl.RdmaSettings.from_annotations(
        dgd.metadata.annotations,
        c.spec.annotations,
        resource_name=config.rdma_resource_name,
        resource_count=config.rdma_resource_count,
        default_ucx_tls=config.ucx_tls,
    )


def pod_spec(
    dgd: DynamoGraphDeployment,
    c: Component,
    config: OperatorConfig,
    container: dict[str, Any],
    rdma: nixl.RdmaSettings | None,
) -> dict[str, Any]:
    """The pod spec around ``container``: volumes, the user's extraPodSpec merged, RDMA wiring."""
    spec: dict[str, Any] = {"containers": [container]}
    volumes = _volumes(dgd, c, config)
    if volumes:
        spec["volumes"] = volumes
    extra = c.spec.extra_pod_spec
    if extra is not None:
        user = extra.model_dump(by_alias=True, exclude_none=True)
        user.pop("mainContainer", None)
        spec = merge(spec, user)
    if rdma is not None:
        spec = nixl.apply_rdma(spec, rdma)
    return spec


def template(
    dgd: DynamoGraphDeployment, c: Component, spec: dict[str, Any], extra_labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A pod template: our labels win over extraPodMetadata's, which win over the service's, which win
    over the graph's (``spec.labels`` / ``spec.annotations``)."""
    pod_labels = {**dgd.spec.labels, **c.spec.labels}
    annotations = {**dgd.spec.annotations, **c.spec.annotations}
    if c.spec.extra_pod_metadata is not None:
        pod_labels.update(c.spec.extra_pod_metadata.labels)
        annotations.update(c.spec.extra_pod_metadata.annotations)
    pod_labels.update(labels.child_labels(dgd.name, c.name, c.component_type))
    pod_labels.update(extra_labels or {})
    metadata: dict[str, Any] = {"labels": pod_labels}
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": spec}


def object_meta(
    dgd: DynamoGraphDeployment, c: Component | None, name: str, extra_labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """Metadata of a child object, owned by the graph (controller) when the graph has a uid."""
    meta_labels: dict[str, str] = dict(dgd.spec.labels)
    annotations: dict[str, str] = dict(dgd.spec.annotations)
    if c is not None:
        meta_labels.update(c.spec.labels)
        annotations.update(c.spec.annotations)
        meta_labels.update(labels.child_labels(dgd.name, c.name, c.component_type))
    else:
        meta_labels.update(labels.graph_selector(dgd.name))
    meta_labels.update(extra_labels or {})
    meta: dict[str, Any] = {"name": name, "namespace": dgd.namespace, "labels": meta_labels}
    if annotations:
        meta["annotations"] = annotations
    if dgd.metadata.uid:
        meta["ownerReferences"] = [
            {
                "apiVersion": STORAGE_API_VERSION,  # the stored version: no conversion to resolve it
                "kind": dgd.kind,
                "name": dgd.name,
                "uid": dgd.metadata.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return meta
