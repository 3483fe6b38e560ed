"""Semantic checks of a graph, beyond what the CRD schema can say. Pure.

``validate(dgd)`` is the one place a DynamoGraphDeployment is judged: the operator's ``render``
refuses a graph with problems (condition ``Ready=False`` + Events), and dynamo-run refuses the same
graph with the same ``Problem``s before starting anything.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from dynamo_api.annotations import BOOL_ANNOTATIONS, MODULE_ANNOTATION, parse_bool
from dynamo_api.components import Component, components
from dynamo_api.models import DynamoGraphDeployment
from dynamo_api.sglang_args import SWAPPABLE_MODULES, SglangArgs, argv, flag_value, parse_args

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_TRANSFER_BACKEND",
    "Problem",
    "gpu_count",
    "is_dns_label",
    "validate",
]

# SGLang's defaults when a flag is unset, used to compare prefill and decode services.
DEFAULT_PAGE_SIZE = "1"
DEFAULT_TRANSFER_BACKEND = "mooncake"
MAX_DNS_LABEL = 63
_GRAPH_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class Problem:
    """An invalid spec: nothing is rendered (or run) until it is fixed.

    ``field`` is the path of the offending field (``spec.services.decode.resources.limits.gpu``),
    ``reason`` one CamelCase word, ``message`` says what is wrong and how to fix it.
    """

    field: str
    reason: str
    message: str


def is_dns_label(value: str) -> bool:
    """True when ``value`` is an RFC 1123 label (lowercase alphanumerics and '-', at most 63)."""
    return len(value) <= MAX_DNS_LABEL and bool(_DNS_LABEL.match(value))


def gpu_count(component: Component) -> str | None:
    """The GPUs per pod as written (limits win over requests); None when unset."""
    resources = component.spec.resources
    if resources is None:
        return None
    for item in (resources.limits, resources.requests):
        if item is not None and item.gpu is not None:
            return item.gpu
    return None


def _check_graph(dgd: DynamoGraphDeployment, comps: list[Component]) -> list[Problem]:
    problems = []
    if not _GRAPH_NAME.match(dgd.name):
        problems.append(
            Problem(
                "metadata.name",
                "InvalidName",
                f"Graph name {dgd.name!r} must start with a letter and contain only lowercase letters, "
                "digits and '-' (it names Services and pod hostnames); rename the DynamoGraphDeployment.",
            )
        )
    framework = dgd.spec.backend_framework
    if framework != "sglang":
        problems.append(
            Problem(
                "spec.backendFramework",
                "UnsupportedBackend",
                f"backendFramework {framework!r} is not supported by this operator, which renders SGLang "
                "graphs only; set backendFramework: sglang and use SGLang workers.",
            )
        )
    if not comps:
        problems.append(
            Problem("spec.services", "NoServices", "spec.services is empty; add a frontend and a worker.")
        )
        return problems
    pickers = [c.name for c in comps if c.kind == "epp"]
    if len(pickers) > 1:
        problems.append(
            Problem(
                "spec.services",
                "MultipleEpp",
                f"Services {', '.join(pickers)} are all endpoint pickers (componentType epp); a graph has "
                "one (it owns the graph's InferencePool <graph>-pool): keep one and give it more replicas.",
            )
        )
    if not any(c.kind == "frontend" for c in comps):
        problems.append(
            Problem(
                "spec.services",
                "NoFrontend",
                "No service has componentType: frontend, so nothing would serve the OpenAI API; "
                "add a service with componentType: frontend.",
            )
        )
    seen: dict[str, str] = {}
    for c in comps:
        lowered = c.name.lower()
        if not is_dns_label(lowered):
            problems.append(
                Problem(
                    c.path,
                    "InvalidName",
                    f"Service name {c.name!r} must be at most 63 letters, digits and '-', starting and "
                    "ending with a letter or digit; rename it.",
                )
            )
        elif lowered in seen:
            problems.append(
                Problem(
                    c.path,
                    "DuplicateName",
                    f"Services {seen[lowered]!r} and {c.name!r} differ only in case, but Kubernetes names "
                    "are lowercase; rename one of them.",
                )
            )
        seen.setdefault(lowered, c.name)
    for key in BOOL_ANNOTATIONS:
        problems += _bool_annotation(dgd.metadata.annotations, key, "metadata.annotations")
    problems += _module_annotation(dgd.metadata.annotations, "metadata.annotations")
    return problems


def _bool_annotation(given: dict[str, str], key: str, where: str) -> list[Problem]:
    try:
        parse_bool(given.get(key))
    except ValueError:
        return [
            Problem(
                f"{where}.{key}",
                "InvalidAnnotation",
                f'Annotation {key}={given[key]!r} must be "true" or "false".',
            )
        ]
    return []


def _module_annotation(given: dict[str, str], where: str) -> list[Problem]:
    value = given.get(MODULE_ANNOTATION)
    if value is None or value in SWAPPABLE_MODULES:
        return []
    return [
        Problem(
            f"{where}.{MODULE_ANNOTATION}",
            "InvalidAnnotation",
            f"Annotation {MODULE_ANNOTATION}={value!r} must name one of {', '.join(SWAPPABLE_MODULES)}.",
        )
    ]


def _check_service(dgd: DynamoGraphDeployment, c: Component) -> list[Problem]:
    problems: list[Problem] = []
    spec = c.spec
    if c.kind is None:
        return [
            Problem(
                f"{c.path}.componentType",
                "MissingComponentType",
                f"Service {c.name!r} has no componentType; set frontend, worker, prefill or decode.",
            )
        ]
    for key in BOOL_ANNOTATIONS:
        problems += _bool_annotation(spec.annotations, key, f"{c.path}.annotations")
    problems += _module_annotation(spec.annotations, f"{c.path}.annotations")
    if spec.multinode is not None and c.kind != "worker":
        problems.append(
            Problem(
                f"{c.path}.multinode",
                "MultinodeNotSupported",
                f"Service {c.name!r} ({c.component_type}) cannot span nodes: only worker, prefill and "
                "decode services take multinode; remove multinode.",
            )
        )
    if c.kind == "generic" and not c.user_container.get("command") and not c.user_container.get("args"):
        problems.append(
            Problem(
                f"{c.path}.extraPodSpec.mainContainer.command",
                "MissingCommand",
                f"Service {c.name!r} has componentType {c.component_type!r}, which this operator runs "
                "as given: set extraPodSpec.mainContainer.image and command.",
            )
        )
    if c.kind == "worker":
        problems += _check_worker(c)
    problems += _check_v1beta1(dgd, c)
    problems += _check_volumes(dgd, c)
    return problems


def _engine_sidecar(c: Component) -> str | None:
    """The name of another container of the pod that runs the engine (SGLang's own server, or a GPU
    limit) while the main container runs no engine: the sidecar pattern."""
    if c.args.runs_engine or c.spec.extra_pod_spec is None:
        return None
    for container in (c.spec.extra_pod_spec.model_extra or {}).get("containers") or []:
        if not isinstance(container, dict):
            continue
        limits = (container.get("resources") or {}).get("limits") or {}
        if parse_args(container).runs_engine or any(k.endswith("/gpu") for k in limits):
            return str(container.get("name") or "(unnamed)")
    return None


def _check_parallelism(c: Component, gpus: str) -> list[Problem]:
    """An engine whose parallelism does not match the GPUs of its pod (or group) cannot start: more
    GPUs than it has, or, over several nodes, a split SGLang cannot make of nodes x GPUs."""
    needed = c.args.gpus_needed
    if needed is None or not gpus.isdigit() or not c.args.runs_engine:
        return []  # a command of the user's own: its flags are not SGLang's to read
    nodes = c.spec.node_count
    available = nodes * int(gpus)
    if needed == available or (nodes == 1 and needed < available):
        return []  # fewer than the pod has: a TpMismatch warning (render.notices)
    where = f"{nodes} pods x {gpus} GPUs = {available}" if nodes > 1 else f"{gpus} GPUs"
    return [
        Problem(
            f"{c.path}.extraPodSpec.mainContainer.args",
            "ParallelismMismatch",
            f"Worker {c.name!r} runs an engine of {needed} GPUs (--tp {c.args.tp} x --pp-size {c.args.pp}"
            + ("" if c.args.dp_attention else f" x --dp-size {c.args.dp}")
            + f") on {where}: "
            + (
                "it cannot start; "
                if needed > available
                else "SGLang spreads one engine over all nodes of a group, so it cannot use them; "
            )
            + f"set --tp to {available} or resources.limits.gpu"
            + (
                f" and multinode.nodeCount so that nodes x gpu = {needed}." if nodes > 1 else f" to {needed}."
            ),
        )
    ]


def _check_worker(c: Component) -> list[Problem]:
    """A worker's engine: where it runs, where its weights come from, its GPUs, its role, its flags."""
    sidecar = _engine_sidecar(c)
    if sidecar is not None:
        return [
            Problem(
                f"{c.path}.extraPodSpec.containers",
                "EngineSidecarNotSupported",
                f"Worker {c.name!r} runs its engine in container {sidecar!r} and its main container as a "
                "client of it (NVIDIA Dynamo's sidecar pattern): this operator's worker runs SGLang "
                "in-process in the main container (token ids in and out, KV events, the disaggregation "
                "handshake) and cannot be the client of another container's server. Run the engine's "
                "flags in the main container (command python3 -m dynamo.sglang, with the GPU limit on "
                "the service) and drop the engine container.",
            )
        ]
    return [*_check_load_format(c), *_check_gpus(c), *_check_roles(c), *_check_flags(c)]


def _check_load_format(c: Component) -> list[Problem]:
    problems = []
    if flag_value(argv(c.command_view), "--load-format") == "gms":
        problems.append(
            Problem(
                f"{c.path}.extraPodSpec.mainContainer.args",
                "GpuMemoryServiceNotSupported",
                f"Worker {c.name!r} loads its weights with --load-format gms, from NVIDIA Dynamo's GPU "
                "Memory Service (a sidecar sharing GPU memory through DRA), which this operator does not "
                "provide and SGLang cannot load from: remove --load-format gms (and gpuMemoryService).",
            )
        )
    return problems


def _check_gpus(c: Component) -> list[Problem]:
    """The GPU limit: set, a whole number, equal to any request, and what the engine's parallelism needs."""
    problems = []
    gpus = gpu_count(c)
    resources = c.spec.resources
    if gpus is None:
        problems.append(
            Problem(
                f"{c.path}.resources.limits.gpu",
                "MissingGpuLimit",
                f"Worker {c.name!r} has no GPU limit; set resources.limits.gpu to the GPUs per pod "
                '(e.g. "1").',
            )
        )
    elif not gpus.isdigit() or int(gpus) < 1:
        problems.append(
            Problem(
                f"{c.path}.resources.limits.gpu",
                "InvalidGpuCount",
                f"Worker {c.name!r} asks for gpu {gpus!r}; set a whole number of at least 1.",
            )
        )
    elif (
        resources is not None
        and resources.limits is not None
        and resources.requests is not None
        and resources.limits.gpu is not None
        and resources.requests.gpu is not None
        and resources.limits.gpu != resources.requests.gpu
    ):
        problems.append(
            Problem(
                f"{c.path}.resources.requests.gpu",
                "GpuRequestMismatch",
                f"Worker {c.name!r} requests {resources.requests.gpu} GPUs but is limited to "
                f"{resources.limits.gpu}; GPUs cannot be overcommitted: make them equal or drop "
                "requests.gpu.",
            )
        )
    else:
        problems += _check_parallelism(c, gpus)
    return problems


def _check_roles(c: Component) -> list[Problem]:
    """The worker's role (``--role``, prefill or decode) said the same way everywhere it is said."""
    problems = []
    args = c.args
    mode = args.disaggregation_mode
    declared = c.spec.sub_component_type or (
        c.component_type if c.component_type in ("prefill", "decode") else None
    )
    if args.worker_role is not None and args.worker_role not in ("language", "encode", "diffusion"):
        problems.append(
            Problem(
                f"{c.path}.extraPodSpec.mainContainer.args",
                "InvalidFlag",
                f"Worker {c.name!r} runs --role {args.worker_role}; use language, encode or diffusion.",
            )
        )
    if args.worker_role in ("encode", "diffusion") and (declared is not None or mode not in (None, "null")):
        problems.append(
            Problem(
                f"{c.path}.extraPodSpec.mainContainer.args",
                "RoleMismatch",
                f"Worker {c.name!r} runs --role {args.worker_role} but is also declared a "
                f"{declared or mode} worker; an {args.worker_role} worker is neither prefill nor decode: "
                "drop subComponentType and --disaggregation-mode from it.",
            )
        )
    if declared is not None and mode is not None and mode != declared:
        problems.append(
            Problem(
                f"{c.path}.extraPodSpec.mainContainer.args",
                "RoleMismatch",
                f"Worker {c.name!r} is declared {declared} but runs --disaggregation-mode {mode}; "
                "make them agree.",
            )
        )
    if (
        c.spec.sub_component_type is not None
        and c.component_type in ("prefill", "decode")
        and c.spec.sub_component_type != c.component_type
    ):
        problems.append(
            Problem(
                f"{c.path}.subComponentType",
                "RoleMismatch",
                f"Worker {c.name!r} has componentType {c.component_type} but subComponentType "
                f"{c.spec.sub_component_type}; make them agree.",
            )
        )
    return problems


def _check_flags(c: Component) -> list[Problem]:
    """The engine flags the operator reads: parallelism sizes and the bootstrap port."""
    problems = []
    args = c.args
    for name, value in (("--tp", args.tp), ("--pp-size", args.pp), ("--dp-size", args.dp)):
        if value is None or value < 1:
            problems.append(
                Problem(
                    f"{c.path}.extraPodSpec.mainContainer.args",
                    "InvalidFlag",
                    f"Worker {c.name!r} has a {name} value that is not a positive whole number; fix it.",
                )
            )
    port = args.bootstrap_port
    if port not in (None, "") and not (port.isdigit() and 1 <= int(port) <= 65535):
        problems.append(
            Problem(
                f"{c.path}.extraPodSpec.mainContainer.args",
                "InvalidFlag",
                f"Worker {c.name!r} has --disaggregation-bootstrap-port {port!r}; use a port 1-65535.",
            )
        )
    return problems


def _check_v1beta1(dgd: DynamoGraphDeployment, c: Component) -> list[Problem]:
    """The v1beta1 component fields this operator cannot honour, or that contradict the spec."""
    placement = dgd.v1beta1.service(c.name)
    problems = []
    wanted = placement.min_available
    if wanted is not None and 0 < c.spec.replicas < wanted:
        problems.append(
            Problem(
                f"{c.path}.minAvailable",
                "MinAvailableAboveReplicas",
                f"Service {c.name!r} asks for minAvailable {wanted} but runs {c.spec.replicas} replicas; "
                "make minAvailable at most replicas.",
            )
        )
    for key, value, what in (
        ("dynamoSidecar", placement.dynamo_sidecar, "an init container running NVIDIA Dynamo's runtime"),
        ("frontendSidecar", placement.frontend_sidecar, "a frontend in another component's pod"),
    ):
        if value is not None:
            problems.append(
                Problem(
                    f"{c.path}.{key}",
                    "SidecarNotSupported",
                    f"Service {c.name!r} sets {key}: {value!r}, {what}, which this operator does not "
                    "render: its worker runs the engine in-process in the main container and frontends run "
                    f"as services of their own. Remove {key} and run the component as its own service.",
                )
            )
    return problems


def _check_volumes(dgd: DynamoGraphDeployment, c: Component) -> list[Problem]:
    problems = []
    names = {p.name for p in dgd.spec.pvcs if p.name}
    for i, mount in enumerate(c.spec.volume_mounts):
        if mount.name not in names:
            problems.append(
                Problem(
                    f"{c.path}.volumeMounts[{i}].name",
                    "UnknownVolume",
                    f"Service {c.name!r} mounts {mount.name!r}, which is not in spec.pvcs; add it there "
                    "or fix the name.",
                )
            )
        if not mount.mount_point:
            problems.append(
                Problem(
                    f"{c.path}.volumeMounts[{i}].mountPoint",
                    "MissingMountPoint",
                    f"Service {c.name!r} mounts {mount.name!r} without a mountPoint; set one (e.g. /models).",
                )
            )
    return problems


def _check_pvcs(dgd: DynamoGraphDeployment) -> list[Problem]:
    problems = []
    for i, pvc in enumerate(dgd.spec.pvcs):
        path = f"spec.pvcs[{i}]"
        if not pvc.name or not is_dns_label(pvc.name):
            problems.append(
                Problem(
                    f"{path}.name", "InvalidName", f"PVC name {pvc.name!r} must be a lowercase DNS label."
                )
            )
        if pvc.create and not (pvc.size and pvc.storage_class and pvc.volume_access_mode):
            problems.append(
                Problem(
                    path,
                    "IncompletePvc",
                    f"PVC {pvc.name!r} has create: true; set size, storageClass and volumeAccessMode too.",
                )
            )
    return problems


def _check_disaggregation(comps: list[Component]) -> list[Problem]:
    prefill = [c for c in comps if c.kind == "worker" and c.role == "prefill"]
    decode = [c for c in comps if c.kind == "worker" and c.role == "decode"]
    problems = []
    if prefill and not decode:
        problems.append(
            Problem(
                prefill[0].path,
                "MissingDecode",
                "The graph has prefill workers but no decode worker to continue their requests; add one.",
            )
        )
    if decode and not prefill:
        problems.append(
            Problem(
                decode[0].path,
                "MissingPrefill",
                "The graph has decode workers but no prefill worker to feed them; add one.",
            )
        )
    pairs = [(p, d) for p in prefill for d in decode]
    checks: tuple[tuple[str, str, str | None, Callable[[SglangArgs], str | None]], ...] = (
        ("--served-model-name", "ModelMismatch", None, lambda a: a.model),
        ("--page-size", "PageSizeMismatch", DEFAULT_PAGE_SIZE, lambda a: a.page_size),
        (
            "--disaggregation-transfer-backend",
            "TransferBackendMismatch",
            DEFAULT_TRANSFER_BACKEND,
            lambda a: a.transfer_backend,
        ),
    )
    for label, reason, default, get in checks:
        for p, d in pairs:
            pv, dv = get(p.args) or default, get(d.args) or default
            if pv != dv and pv is not None and dv is not None:
                problems.append(
                    Problem(
                        f"{d.path}.extraPodSpec.mainContainer.args",
                        reason,
                        f"Prefill {p.name!r} runs {label} {pv} but decode {d.name!r} runs {label} {dv}; "
                        "the KV cache they hand over must have one layout: set the same value on both.",
                    )
                )
    return problems


def validate(dgd: DynamoGraphDeployment) -> tuple[Problem, ...]:
    """Every problem of the graph, in a stable order (graph first, then services by name)."""
    comps = components(dgd)
    problems = _check_graph(dgd, comps)
    problems += _check_pvcs(dgd)
    for c in comps:
        problems += _check_service(dgd, c)
    problems += _check_disaggregation(comps)
    return tuple(problems)
