"""Decide which local processes run a graph: the operator's ``render()``, then a kubelet's substitutions.

More: docs/module-notes.md (dynamo_worker.local.plan)."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from dynamo_api import contract as c
from dynamo_api import modules
from dynamo_api.components import WORKER_TYPES
from dynamo_api.errors import DynamoError
from dynamo_api.models import DynamoGraphDeployment
from dynamo_api.sglang_args import argv as container_argv
from dynamo_api.sglang_args import flag_value, served_model_name
from dynamo_api.validation import Problem
from dynamo_operator.backends import sglang as flags
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import Rendered, labels, render

from dynamo_worker.local.kubelet import LOOPBACK, Pod, localize, pods_of

__all__ = [
    "Engine",
    "Plan",
    "PlanError",
    "Problem",
    "ProcessSpec",
    "format_problems",
    "local_config",
    "machine_env",
    "plan_graph",
]

Engine = Literal["mocker", "sglang"]
Kind = Literal["frontend", "worker", "planner"]

# What a frontend or worker pod may run here: NVIDIA Dynamo's names first, then ours.
_SERVING_MODULES = [
    name for name in (*modules.DYNAMO_ALIASES, *modules.ROLES) if modules.role(name) in ("engine", "frontend")
]


def format_problems(problems: Sequence[Problem]) -> str:
    """One ``field: message`` line per problem (the operator's condition joins the same with '; ')."""
    return "\n".join(f"{p.field}: {p.message}" for p in problems)


class PlanError(DynamoError):
    """The graph cannot run on this machine as asked; ``problems`` say why and how to fix it."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__(format_problems(self.problems))


@dataclass(frozen=True)
class ProcessSpec:
    name: str  # "decode-0" ("decode-0-1": rank 1 of group 0); the prefix of its log lines, its log file
    service: str
    kind: Kind
    argv: tuple[str, ...]
    env: Mapping[str, str]
    health_url: str | None  # its readinessProbe on this machine; None: ready once started
    waiting_for: str  # what its readiness means, for the progress lines
    gpus: tuple[str, ...] = ()
    # Frontend: ready only once its /metrics gauge FRONTEND_WORKERS_METRIC adds up to this many workers.
    expected_workers: int = 0
    metrics_url: str | None = None  # the frontend's /metrics (read for readiness), a planner's planner_*
    pod: str = ""  # the pod's name in the cluster (POD_NAME)
    ports: Mapping[int, int] = field(default_factory=dict)  # declared containerPort -> local port
    group: str | None = None  # a multinode worker's group (its pods restart together)


@dataclass(frozen=True)
class Plan:
    namespace: str
    processes: tuple[ProcessSpec, ...]
    url: str  # where to send OpenAI requests
    served_models: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())


def machine_env(*, http_host: str, grace_s: float, path: str) -> dict[str, str]:
    """What this machine gives every process, under the pod's env (a pod gets the like from its image
    and its network): ``path`` (this interpreter's folder first, so the pod's ``python3`` is this one),
    binds on the loopback (the frontend's on ``http_host``), unbuffered output, the grace period."""
    return {
        "PATH": path,
        "PYTHONUNBUFFERED": "1",
        c.ENV_LISTEN_HOST: LOOPBACK,
        c.ENV_HTTP_HOST: http_host,
        c.ENV_GRACEFUL_SHUTDOWN_S: f"{grace_s:g}",
    }


def local_config(nats_url: str) -> OperatorConfig:
    """The operator config a local run renders with: the embedded NATS, text logs, StatefulSet groups."""
    return OperatorConfig(nats_url=nats_url, pod_log_format="text", group_backend="statefulset")


def _module(container: Mapping[str, Any]) -> str | None:
    words = container_argv(dict(container))
    for i in range(1, len(words) - 1):
        if words[i] == "-m" and "python" in words[i - 1].rsplit("/", 1)[-1]:
            return words[i + 1]
    return None


def _gpus(container: Mapping[str, Any]) -> int:
    limits = container.get("resources", {}).get("limits", {})
    return sum(int(v) for k, v in limits.items() if k.endswith("gpu") and str(v).isdigit())


def _with_engine(
    container: Mapping[str, Any], module: str, engine_module: str, model_dir: str | None
) -> dict[str, Any]:
    """The container running ``engine_module`` where it ran ``module`` (the engine substitution)."""
    out, _ = flags.swap_module(dict(container), module, engine_module)
    if model_dir is not None and engine_module == modules.MOCKER_MODULE:
        out = flags.append_flags(out, ["--model-dir", model_dir])
    elif model_dir is not None:
        out, _ = flags.ensure_flag(out, "--model-path", model_dir)
    return out


@dataclass(frozen=True)
class _PodProcess:
    """One pod of the graph as the process that will run it, before its ports and GPU ids are given."""

    pod: Pod
    label: str
    service: str
    kind: Kind
    container: Mapping[str, Any]
    gpus: int


def _label(pod: Pod, service: str, groups: Mapping[str, int], replica: int) -> str:
    group = pod.labels.get(labels.GROUP)
    if group is None:
        return f"{service}-{replica}"
    rank = int(pod.labels.get(labels.POD_INDEX, "0"))
    return f"{service}-{groups[group]}" + (f"-{rank}" if rank else "")


def plan_graph(
    dgd: DynamoGraphDeployment,
    *,
    engine: Engine,
    nats_url: str,
    http_host: str,
    http_port: int,
    mocker_model_dir: str | None,  # the mocker's tokenizer folder (--model-dir)
    sglang_model_path: str | None,  # replaces --model-path of SGLang workers when given
    gpus: Sequence[str],
    free_port: Callable[[], int],
    machine: Mapping[str, str],  # machine_env(...)
    graph_file: str | None = None,  # the manifest ``dgd`` was read from; planners read it (None: skipped)
) -> Plan:
    """The processes that serve ``dgd`` here. Raises ``PlanError`` listing every problem found."""
    rendered = render(dgd, local_config(nats_url))
    if rendered.problems:
        raise PlanError(rendered.problems)
    model_dirs = {modules.MOCKER_MODULE: mocker_model_dir, modules.SGLANG_MODULE: sglang_model_path}
    runs, problems, notes = _Selector(rendered, engine, model_dirs, graph_file is not None).select()
    problems += _gpu_problems(runs, gpus) or _shared_gpu_problems(runs, gpus)
    if problems:
        raise PlanError(problems)
    url_host = LOOPBACK if http_host in ("0.0.0.0", "::", "") else http_host
    processes = _processes(runs, _local_ports(runs, http_port, free_port), machine, gpus, url_host, notes)
    frontend_metrics = f"http://{url_host}:{http_port}{c.METRICS_PATH}"
    processes = _frontends_wait_for_workers(processes, frontend_metrics)
    if graph_file is not None:
        processes = [_local_planner(p, graph_file, frontend_metrics) for p in processes]
        notes += _planner_note([p for p in processes if p.kind == "planner"], frontend_metrics)
    served = [served_model_name(p.argv) for p in processes if p.kind == "worker" and p.health_url]
    return Plan(
        namespace=dgd.dynamo_namespace,
        processes=tuple(processes),
        url=f"http://{url_host}:{http_port}",
        served_models=tuple(dict.fromkeys(m for m in served if m)),
        notes=tuple(notes),
    )


def _local_ports(
    runs: Sequence[_PodProcess], http_port: int, free_port: Callable[[], int]
) -> dict[str, dict[int, int]]:
    """Per pod, each declared containerPort's local port: ``http_port`` for the frontend's ``http``
    (what its Service publishes), a free one for every other."""
    return {
        r.pod.name: {
            number: http_port if r.kind == "frontend" and name == "http" else free_port()
            for name, number in r.pod.declared_ports.items()
        }
        for r in runs
    }


def _processes(
    runs: Sequence[_PodProcess],
    ports: Mapping[str, Mapping[int, int]],
    machine: Mapping[str, str],
    gpus: Sequence[str],
    url_host: str,
    notes: list[str],
) -> list[ProcessSpec]:
    """One process per run, given its GPUs in order; the kubelet's notes are added to ``notes``."""
    peers = {r.pod.dns_name: ports[r.pod.name] for r in runs if r.pod.dns_name}
    free_gpus = list(gpus)
    processes = []
    for r in runs:
        assigned = tuple(free_gpus[: r.gpus])
        del free_gpus[: r.gpus]
        process, process_notes = _process(r, ports[r.pod.name], peers, machine, assigned, url_host)
        processes.append(process)
        notes += process_notes
    return processes


def _frontends_wait_for_workers(processes: list[ProcessSpec], frontend_metrics: str) -> list[ProcessSpec]:
    """A frontend is ready once it sees every worker that has a readiness probe (on its /metrics)."""
    workers = sum(1 for p in processes if p.kind == "worker" and p.health_url)
    return [
        replace(
            p,
            expected_workers=workers,
            metrics_url=frontend_metrics,
            waiting_for=f"{p.waiting_for}, seeing all {workers} workers",
        )
        if p.kind == "frontend"
        else p
        for p in processes
    ]


def _shown(pod: Pod) -> str:
    return " ".join(container_argv(dict(pod.main))) or "(no command)"


class _Selector:
    """The pods that run here, each with its engine substituted; the problems and notes found.
    ``planners``: whether pods running our planner run (they need the manifest's file)."""

    def __init__(
        self, rendered: Rendered, engine: Engine, model_dirs: Mapping[str, str | None], planners: bool
    ) -> None:
        self.rendered = rendered
        self.engine = engine
        self.model_dirs = model_dirs
        self.planners = planners
        self.groups = {g.name: i for plan in rendered.services.values() for i, g in enumerate(plan.groups)}
        self.runs: list[_PodProcess] = []
        self.problems: list[Problem] = []
        self.notes = [
            f"{n}: replicas=0; nothing to run" for n, s in rendered.services.items() if not s.replicas
        ]

    def select(self) -> tuple[list[_PodProcess], list[Problem], list[str]]:
        replicas: dict[str, int] = {}
        for pod in pods_of(self.rendered.objects):
            service = pod.labels[labels.COMPONENT]
            replica = replicas[service] = replicas.get(service, -1) + 1
            module = _module(pod.main)
            self._treatment(pod, module)(pod, service, replica, module)
        return self.runs, self.problems, self.notes

    def _treatment(self, pod: Pod, module: str | None) -> Callable[[Pod, str, int, str | None], None]:
        """Which of the methods below treats this pod: by the module its main container runs (ours or
        NVIDIA Dynamo's name for it), else by its componentType."""
        role = modules.role(module)
        component_type = pod.labels.get(labels.COMPONENT_TYPE, "")
        if role == "frontend":
            return self._frontend
        if role == "engine":
            return self._engine
        if component_type in WORKER_TYPES or component_type == "frontend":
            return self._unsupported
        if component_type == "planner":
            return self._planner if role == "planner" and self.planners else self._no_planner
        if component_type == "epp":
            return self._picker
        return self._skipped

    def _frontend(self, pod: Pod, service: str, replica: int, module: str | None) -> None:
        """One frontend runs (it takes --port)."""
        if any(r.kind == "frontend" for r in self.runs):
            self.notes.append(f"{pod.name}: one frontend runs locally (it takes --port); skipped")
            return
        ours = modules.ours(module)
        assert module is not None and ours is not None
        container = _with_engine(pod.main, module, ours, None)
        self.runs.append(_PodProcess(pod, f"{service}-{replica}", service, "frontend", container, 0))

    def _engine(self, pod: Pod, service: str, replica: int, module: str | None) -> None:
        """A worker runs the engine asked for (the mocker's pods stay the mocker); SGLang needs GPUs."""
        assert module is not None
        ours = modules.ours(module)
        target = modules.MOCKER_MODULE if ours == modules.MOCKER_MODULE else modules.ENGINES[self.engine]
        need = _gpus(pod.main) if target == modules.SGLANG_MODULE else 0
        if target == modules.SGLANG_MODULE and need == 0:
            self.problems.append(
                Problem(
                    f"spec.services.{service}.resources.limits.gpu",
                    "MissingGpuLimit",
                    "an SGLang worker needs GPUs: set resources.limits.gpu, or run with --engine mocker",
                )
            )
            return
        container = _with_engine(pod.main, module, target, self.model_dirs[target])
        label = _label(pod, service, self.groups, replica)
        self.runs.append(_PodProcess(pod, label, service, "worker", container, need))

    def _unsupported(self, pod: Pod, service: str, _replica: int, _module: str | None) -> None:
        self.problems.append(
            Problem(
                f"spec.services.{service}.extraPodSpec.mainContainer.command",
                "UnsupportedCommand",
                f"runs {_shown(pod)!r}; dynamo-run runs services whose command is 'python3 -m MODULE ...' "
                f"with MODULE one of {', '.join(_SERVING_MODULES)}; give the service such a command",
            )
        )

    def _planner(self, pod: Pod, service: str, replica: int, module: str | None) -> None:
        assert module is not None
        container = _with_engine(pod.main, module, modules.PLANNER_MODULE, None)
        self.runs.append(_PodProcess(pod, f"{service}-{replica}", service, "planner", container, 0))

    def _no_planner(self, pod: Pod, _service: str, _replica: int, module: str | None) -> None:
        why = (
            f"it runs {_shown(pod)!r}"
            if modules.role(module) != "planner"
            else "no manifest file to read its graph from"
        )
        self.notes.append(
            f"{pod.name}: a planner runs here only as 'python3 -m {modules.PLANNER_MODULE} ...' (or "
            f"{modules.DYNAMO_PLANNER_MODULE}) reading the manifest file ({why}); not run locally "
            "(skipped)"
        )

    def _picker(self, pod: Pod, service: str, _replica: int, _module: str | None) -> None:
        """A graph behind a gateway is refused: its frontends route only as the picker tells them."""
        if any(p.reason == "EppNotLocal" for p in self.problems):
            return
        self.problems.append(
            Problem(
                f"spec.services.{service}.componentType",
                "EppNotLocal",
                "an endpoint picker (componentType epp) serves a Gateway API gateway, which dynamo-run "
                "does not run, and the graph's frontends run --router-mode direct behind it; remove the "
                "service to run the graph here (its frontend then routes itself)",
            )
        )

    def _skipped(self, pod: Pod, _service: str, _replica: int, _module: str | None) -> None:
        component_type = pod.labels.get(labels.COMPONENT_TYPE, "")
        self.notes.append(
            f"{pod.name}: componentType {component_type or '(unset)'} runs as given in Kubernetes; "
            "not run locally (skipped)"
        )


def _local_planner(p: ProcessSpec, graph_file: str, frontend_metrics: str) -> ProcessSpec:
    """A planner process with what a cluster gives it in place of the Kubernetes API (its graph from
    the manifest file, the local frontend's metrics) and ``--dry-run``; flags added after the kubelet's
    substitutions, so no port number in them is taken for a port of the pod; its /metrics URL."""
    if p.kind != "planner":
        return p
    container: dict[str, Any] = {"command": list(p.argv)}
    container, _ = flags.ensure_flag(container, "--graph-file", graph_file)
    container, _ = flags.ensure_flag(container, "--metrics-url", frontend_metrics)
    if "--dry-run" not in container_argv(container):
        container = flags.append_flags(container, ["--dry-run"])
    system = p.ports.get(c.SYSTEM_PORT)
    metrics = f"http://{LOOPBACK}:{system}{c.METRICS_PATH}" if system else None
    argv = (*container.get("command", []), *container.get("args", []))
    return replace(p, argv=argv, metrics_url=metrics)


def _planner_note(planners: Sequence[ProcessSpec], frontend_metrics: str) -> list[str]:
    if not planners:
        return []
    names = ", ".join(p.name for p in planners)
    exported = ", ".join(p.metrics_url for p in planners if p.metrics_url) or "its system port"
    return [
        f"{names}: dynamo-run cannot change the replicas of local processes, so the planner runs with "
        f"--dry-run: every adjustment interval it reads the frontend's metrics ({frontend_metrics}), "
        f"decides and logs what it would scale ('Would scale ...') and exports planner_* metrics on "
        f"{exported}; the graph keeps the manifest's replicas"
    ]


def _gpu_problems(runs: Sequence[_PodProcess], gpus: Sequence[str]) -> list[Problem]:
    needed = sum(r.gpus for r in runs)
    if needed <= len(gpus):
        return []
    wanted = ", ".join(f"{r.label} needs {r.gpus}" for r in runs if r.gpus)
    return [
        Problem(
            "spec.services.*.resources.limits.gpu",
            "NotEnoughGpus",
            f"the graph needs {needed} GPUs on the SGLang engine ({wanted}) but "
            f"{len(gpus)} are visible ({', '.join(gpus) or 'none'}); free GPUs, lower replicas, "
            "or run with --engine mocker",
        )
    ]


# SGLang engines that share a GPU must leave each other room: their --mem-fraction-static (a share of
# the whole GPU each) may add up to this much.
SHARED_GPU_MEM_FRACTION = 0.9


def _shared_gpu_problems(runs: Sequence[_PodProcess], gpus: Sequence[str]) -> list[Problem]:
    """Engines that would share a GPU (one listed twice in CUDA_VISIBLE_DEVICES, e.g. ``0,0`` to run a
    prefill and a decode worker on one GPU) must each set ``--mem-fraction-static``, adding up to at
    most ``SHARED_GPU_MEM_FRACTION``: SGLang's default (about 0.85) is a share of the whole GPU, so the
    second engine could not load."""
    owners: dict[str, list[_PodProcess]] = {}
    free = list(gpus)
    for r in runs:
        for gpu in free[: r.gpus]:
            owners.setdefault(gpu, []).append(r)
        del free[: r.gpus]
    problems = []
    for gpu, sharing in owners.items():
        if len(sharing) < 2:
            continue
        fractions = [_mem_fraction(r.container) for r in sharing]
        if None not in fractions and sum(f for f in fractions if f) <= SHARED_GPU_MEM_FRACTION:
            continue
        given = ", ".join(
            f"{r.label} {'unset' if f is None else f}" for r, f in zip(sharing, fractions, strict=True)
        )
        problems.append(
            Problem(
                "spec.services.*.extraPodSpec.mainContainer.args",
                "GpuShared",
                f"{', '.join(r.label for r in sharing)} share GPU {gpu} (CUDA_VISIBLE_DEVICES lists it for "
                f"each), and SGLang sizes each engine as a share of the whole GPU (--mem-fraction-static: "
                f"{given}; about 0.85 when unset), so they cannot all load: give each engine "
                f"--mem-fraction-static so that they add up to at most {SHARED_GPU_MEM_FRACTION} (0.4 each "
                "for two) and a --max-total-tokens that fits its share, or give each engine its own GPU",
            )
        )
    return problems


def _mem_fraction(container: Mapping[str, Any]) -> float | None:
    """The engine's ``--mem-fraction-static``; 0 for an encode worker (a vision tower, not an SGLang
    engine: it takes only what its weights need)."""
    tokens = [t for word in container_argv(dict(container)) for t in shlex.split(word)]
    if flag_value(tokens, "--role") == "encode":
        return 0.0
    value = flag_value(tokens, "--mem-fraction-static")
    try:
        return float(value) if value else None
    except ValueError:
        return None


def _process(
    r: _PodProcess,
    ports: Mapping[int, int],
    peers: Mapping[str, Mapping[int, int]],
    machine: Mapping[str, str],
    gpus: tuple[str, ...],
    url_host: str,
) -> tuple[ProcessSpec, list[str]]:
    """``r``'s pod as a process: the kubelet's substitutions, the machine's env under the pod's, GPUs."""
    pod = replace(r.pod, spec={**r.pod.spec, "containers": [r.container]})
    local = localize(pod, ports, peers)
    notes = [
        f"{pod.name}: env {n} comes from valueFrom, which is not read locally; skipped (export {n} in this "
        "shell to give it to every process)"
        for n in local.unread
    ]
    if r.container.get("envFrom"):
        notes.append(
            f"{pod.name}: envFrom ({', '.join(_sources(r.container['envFrom']))}) is not read locally; "
            "export the variables it holds in this shell instead"
        )
    others = [x.get("name", "?") for x in [*pod.spec.get("initContainers", []), *r.pod.spec["containers"]]]
    others = [n for n in others if n != r.container.get("name")]
    if others:
        notes.append(f"{pod.name}: containers {', '.join(others)} are not run locally; only main runs")
    env = {**machine, **local.env}
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    probe = _probe_url(r.container, pod.declared_ports, ports, url_host if r.kind == "frontend" else LOOPBACK)
    process = ProcessSpec(
        name=r.label,
        service=r.service,
        kind=r.kind,
        argv=local.argv,
        env=env,
        health_url=probe,
        waiting_for=f"readinessProbe {probe}" if probe else "nothing (no readinessProbe)",
        gpus=gpus,
        pod=pod.name,
        ports=ports,
        group=pod.labels.get(labels.GROUP),
    )
    return process, notes


def _sources(env_from: Sequence[Mapping[str, Any]]) -> list[str]:
    return [
        f"{kind} {ref.get('name', '?')}"
        for item in env_from
        for kind, ref in item.items()
        if isinstance(ref, Mapping)
    ]


def _probe_url(
    container: Mapping[str, Any], named: Mapping[str, int], ports: Mapping[int, int], host: str
) -> str | None:
    get = container.get("readinessProbe", {}).get("httpGet")
    if get is None:
        return None
    port = get["port"]
    number = named.get(port) if isinstance(port, str) and not port.isdigit() else int(port)
    if number is None:
        return None
    return f"http://{host}:{ports.get(number, number)}{get.get('path', '/')}"
