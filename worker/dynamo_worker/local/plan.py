"""Decide which local processes run a graph: pure, from a parsed manifest and the host's facts.

``plan_graph`` is dynamo-run's ``render``: the same graph, engine, GPUs and ports give the same
processes. Each service replica becomes one process with the environment the operator would give its
pod (the names come from ``dynamo_operator.api.contract``), a free port for everything that listens,
and the GPUs its ``resources.limits.gpu`` asks for. The graph is one the operator's validation accepted
(``manifest.parse_manifest`` runs it); what still cannot run on this machine (too few GPUs, a command
dynamo-run cannot map) is a ``PlanError`` of ``Problem``s (the operator's type) naming the field, the
reason and the fix.

Command mapping (the only place it is decided):

- a ``frontend`` service: ``python -m dynamo_worker.frontend`` on ``--host``/``--port``; the manifest's
  ``--router-mode`` is kept. One frontend runs whatever its ``replicas`` (one HTTP port).
- a worker whose command runs ``dynamo.sglang`` or ``dynamo_worker.sglang``: the mocker (``python -m
  dynamo_worker.mocker`` + the same SGLang arguments + ``--model-dir``) or our SGLang worker.
- a worker running ``dynamo_worker.mocker``: the mocker, whatever the engine.
- a multinode service (``multinode.nodeCount: N``): one process per group; with SGLang it gets
  N x ``limits.gpu`` GPUs of this machine.
- a service with no command runs the operator's default command (``contract.FRONTEND_COMMAND`` or
  ``contract.WORKER_COMMAND``) with its args, as in a pod.
- other component types (planner, epp, ...) run only when their command is one of the above; else they
  are skipped with a note. A worker whose command is something else is refused.

Per worker process, ``--host`` becomes the advertise host, ``--port`` a free port (SGLang derives its
internal ports from it), and a prefill's ``--disaggregation-bootstrap-port`` a free port (decode
workers learn it from discovery), so replicas on one machine never collide. An SGLang worker gets no
``--disaggregation-bootstrap-port``: it picks a free one itself and checks that SGLang bound it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from dynamo_operator.api import contract as c
from dynamo_operator.api.sglang_args import flag_value
from dynamo_operator.api.validation import Problem

from dynamo_worker.local.commands import drop_flag, parse_module_command, set_flag

__all__ = [
    "Engine",
    "GraphView",
    "Plan",
    "PlanError",
    "Problem",
    "ProcessSpec",
    "ServiceView",
    "format_problems",
    "graph_namespace",
    "plan_graph",
]

Engine = Literal["mocker", "sglang"]

SGLANG_MODULES = frozenset({c.SGLANG_MODULE, c.DYNAMO_SGLANG_MODULE})
ADVERTISE_HOST = "127.0.0.1"
WORKER_TYPES = frozenset({"worker", "prefill", "decode"})


@dataclass(frozen=True)
class ServiceView:
    """What dynamo-run needs of one ``spec.services`` entry (built from the api models)."""

    name: str
    component_type: str
    replicas: int = 1
    node_count: int = 1
    gpus_per_node: int = 0
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    envs: tuple[tuple[str, str], ...] = ()
    env_from_secret: str | None = None


@dataclass(frozen=True)
class GraphView:
    name: str
    namespace: str = "default"
    dynamo_namespace: str = ""  # DYN_NAMESPACE, as the api models compute it
    services: tuple[ServiceView, ...] = ()
    envs: tuple[tuple[str, str], ...] = ()


def format_problems(problems: Sequence[Problem]) -> str:
    """One ``field: message`` line per problem (the operator's condition joins the same with '; ')."""
    return "\n".join(f"{p.field}: {p.message}" for p in problems)


class PlanError(Exception):
    """The graph cannot run on this machine as asked; ``problems`` say why and how to fix it."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__(format_problems(self.problems))


@dataclass(frozen=True)
class ProcessSpec:
    name: str  # "decode-0"; the prefix of its log lines and the name of its log file
    service: str
    kind: Literal["frontend", "worker"]
    argv: tuple[str, ...]
    env: Mapping[str, str]
    health_url: str
    waiting_for: str  # what its readiness means, for the progress lines
    gpus: tuple[str, ...] = ()
    # Frontend: ready only once its /metrics gauge FRONTEND_WORKERS_METRIC adds up to this many workers.
    expected_workers: int = 0
    metrics_url: str | None = None


@dataclass(frozen=True)
class Plan:
    namespace: str
    processes: tuple[ProcessSpec, ...]
    url: str  # where to send OpenAI requests
    served_models: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())


def graph_namespace(graph: GraphView) -> str:
    """DYN_NAMESPACE as the operator sets it (``<k8s-namespace>-<dgd-name>``)."""
    return graph.dynamo_namespace or f"{graph.namespace}-{graph.name}"


def _service_field(svc: ServiceView, path: str) -> str:
    return f"spec.services.{svc.name}.{path}" if path else f"spec.services.{svc.name}"


def _base_env(graph: GraphView, svc: ServiceView, pod: str, nats_url: str, grace_s: float) -> dict[str, str]:
    env = {name: value for name, value in graph.envs}
    env.update({name: value for name, value in svc.envs})
    env.update(
        {
            c.ENV_NAMESPACE: graph_namespace(graph),
            c.ENV_COMPONENT: svc.name,
            c.ENV_NATS_SERVER: nats_url,
            c.ENV_POD_NAME: pod,
            c.ENV_POD_NAMESPACE: graph.namespace,
            c.ENV_POD_IP: ADVERTISE_HOST,
            c.ENV_ADVERTISE_HOST: ADVERTISE_HOST,
            c.ENV_LISTEN_HOST: ADVERTISE_HOST,
            c.ENV_GRACEFUL_SHUTDOWN_S: f"{grace_s:g}",
            c.ENV_GRAPH_NAME: graph.name,
            c.ENV_GRAPH_NAMESPACE: graph.namespace,
            c.ENV_LOG_FORMAT: "text",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _served_model(args: Sequence[str]) -> str | None:
    return flag_value(args, "--served-model-name") or flag_value(args, "--model-path", "--model")


def plan_graph(
    graph: GraphView,
    *,
    engine: Engine,
    nats_url: str,
    host: str,
    port: int,
    python: str,
    mocker_model_dir: str | None,  # the mocker's tokenizer folder (--model-dir)
    sglang_model_path: str | None,  # replaces --model-path of SGLang workers when given
    gpus: Sequence[str],
    free_port: Callable[[], int],
    grace_s: float = 10.0,
) -> Plan:
    """The processes that serve ``graph`` here. Raises ``PlanError`` listing every problem found."""
    problems: list[Problem] = []
    notes: list[str] = []
    processes: list[ProcessSpec] = []
    served: list[str] = []
    free_gpus = list(gpus)
    gpu_needs: list[tuple[str, int]] = []
    frontends = [s for s in graph.services if s.component_type == "frontend"]
    for svc in graph.services:
        if svc.env_from_secret:
            notes.append(
                f"{svc.name}: envFromSecret {svc.env_from_secret!r} is not read locally; "
                "export the variables it holds in this shell instead"
            )
        if svc.component_type == "frontend":
            if svc is not frontends[0]:
                notes.append(f"{svc.name}: a second frontend is not run locally; skipped")
                continue
            if svc.replicas != 1:
                notes.append(f"{svc.name}: replicas={svc.replicas}; one frontend runs locally (one port)")
            processes.append(_frontend(graph, svc, nats_url, host, port, python, grace_s))
            continue
        if svc.replicas == 0:
            notes.append(f"{svc.name}: replicas=0; nothing to run")
            continue
        # No command: the operator runs its default worker command with the args.
        command = svc.command or (c.WORKER_COMMAND if svc.component_type in WORKER_TYPES else ())
        found = parse_module_command(command, svc.args)
        runnable = found is not None and (found.module in SGLANG_MODULES or found.module == c.MOCKER_MODULE)
        if svc.component_type not in WORKER_TYPES and not runnable:
            notes.append(
                f"{svc.name}: componentType {svc.component_type} runs as given in Kubernetes; "
                "not run locally (skipped)"
            )
            continue
        if found is None or not runnable:
            shown = " ".join((*svc.command, *svc.args)) or "(no command)"
            problems.append(
                Problem(
                    _service_field(svc, "extraPodSpec.mainContainer.command"),
                    "UnsupportedCommand",
                    f"runs {shown!r}; dynamo-run runs workers whose command is "
                    f"'python3 -m {c.DYNAMO_SGLANG_MODULE} ...' (or {c.SGLANG_MODULE} / {c.MOCKER_MODULE}); "
                    "give the service such a command",
                )
            )
            continue
        module = c.MOCKER_MODULE if found.module == c.MOCKER_MODULE or engine == "mocker" else c.SGLANG_MODULE
        gpus_per_process = svc.gpus_per_node * max(svc.node_count, 1) if module == c.SGLANG_MODULE else 0
        if module == c.SGLANG_MODULE and gpus_per_process == 0:
            problems.append(
                Problem(
                    _service_field(svc, "resources.limits.gpu"),
                    "MissingGpuLimit",
                    "an SGLang worker needs GPUs: set resources.limits.gpu, or run with --engine mocker",
                )
            )
            continue
        if svc.node_count > 1:
            notes.append(
                f"{svc.name}: multinode (nodeCount={svc.node_count}) runs as one process per group"
                + (f" with {gpus_per_process} GPUs" if gpus_per_process else " on the mocker")
            )
        model = _served_model(found.args)
        if model and model not in served:
            served.append(model)
        for replica in range(svc.replicas):
            pod = f"{svc.name}-{replica}"
            assigned: tuple[str, ...] = ()
            if gpus_per_process:
                gpu_needs.append((pod, gpus_per_process))
                assigned = tuple(free_gpus[:gpus_per_process])
                del free_gpus[:gpus_per_process]
            processes.append(
                _worker(
                    graph,
                    svc,
                    pod,
                    module,
                    found.args,
                    assigned,
                    nats_url,
                    python,
                    mocker_model_dir if module == c.MOCKER_MODULE else sglang_model_path,
                    free_port,
                    grace_s,
                )
            )
    needed = sum(n for _, n in gpu_needs)
    if needed > len(gpus):
        wanted = ", ".join(f"{pod} needs {n}" for pod, n in gpu_needs)
        problems.append(
            Problem(
                "spec.services.*.resources.limits.gpu",
                "NotEnoughGpus",
                f"the graph needs {needed} GPUs on the SGLang engine ({wanted}) but "
                f"{len(gpus)} are visible ({', '.join(gpus) or 'none'}); free GPUs, lower replicas, "
                "or run with --engine mocker",
            )
        )
    if problems:
        raise PlanError(problems)
    workers = sum(1 for p in processes if p.kind == "worker")
    processes = [
        replace(
            p,
            expected_workers=workers,
            waiting_for=f"{p.waiting_for}, seeing all {workers} workers",
        )
        if p.kind == "frontend"
        else p
        for p in processes
    ]
    probe_host = ADVERTISE_HOST if host in ("0.0.0.0", "::", "") else host
    return Plan(
        namespace=graph_namespace(graph),
        processes=tuple(processes),
        url=f"http://{probe_host}:{port}",
        served_models=tuple(served),
        notes=tuple(notes),
    )


def _frontend(
    graph: GraphView, svc: ServiceView, nats_url: str, host: str, port: int, python: str, grace_s: float
) -> ProcessSpec:
    # No command: the operator runs its default frontend command with the args.
    found = parse_module_command(svc.command or c.FRONTEND_COMMAND, svc.args)
    argv = [
        python,
        "-m",
        c.FRONTEND_MODULE,
        "--http-host",
        host,
        "--http-port",
        str(port),
        "--namespace",
        graph_namespace(graph),
        "--nats-server",
        nats_url,
    ]
    router_mode = flag_value(found.args, "--router-mode") if found else None
    if router_mode:
        argv += ["--router-mode", router_mode]
    env = _base_env(graph, svc, svc.name, nats_url, grace_s)
    env[c.ENV_HTTP_PORT] = str(port)
    probe_host = ADVERTISE_HOST if host in ("0.0.0.0", "::", "") else host
    return ProcessSpec(
        name=svc.name,
        service=svc.name,
        kind="frontend",
        argv=tuple(argv),
        env=env,
        health_url=f"http://{probe_host}:{port}{c.HEALTH_PATH}",
        metrics_url=f"http://{probe_host}:{port}{c.METRICS_PATH}",
        waiting_for=f"{c.HEALTH_PATH} on :{port} (200 once a model is served)",
    )


def _worker(
    graph: GraphView,
    svc: ServiceView,
    pod: str,
    module: str,
    sglang_args: Sequence[str],
    gpus: tuple[str, ...],
    nats_url: str,
    python: str,
    model_dir: str | None,
    free_port: Callable[[], int],
    grace_s: float,
) -> ProcessSpec:
    args = set_flag(sglang_args, "--host", ADVERTISE_HOST)
    args = set_flag(args, "--port", str(free_port()))
    mode = flag_value(args, "--disaggregation-mode")
    if module == c.SGLANG_MODULE:
        # Our SGLang worker picks a free bootstrap port itself, checks that SGLang bound it (another
        # one on conflict) and publishes it; one chosen here would sit unbound while weights load.
        args = drop_flag(args, "--disaggregation-bootstrap-port")
    elif mode == "prefill" or flag_value(args, "--disaggregation-bootstrap-port") is not None:
        args = set_flag(args, "--disaggregation-bootstrap-port", str(free_port()))
    if module == c.MOCKER_MODULE and model_dir is not None:
        args = set_flag(args, "--model-dir", model_dir)
    elif model_dir is not None:
        args = set_flag(args, "--model-path", model_dir, "--model")
    system_port = free_port()
    env = _base_env(graph, svc, pod, nats_url, grace_s)
    env.update(
        {
            c.ENV_SYSTEM_PORT: str(system_port),
            c.ENV_SYSTEM_ENABLED: "true",
            c.ENV_REQUEST_PORT: str(free_port()),
            c.ENV_ENDPOINT: c.DEFAULT_ENDPOINT,
        }
    )
    if module == c.SGLANG_MODULE:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return ProcessSpec(
        name=pod,
        service=svc.name,
        kind="worker",
        argv=(python, "-m", module, *args),
        env=env,
        health_url=f"http://{ADVERTISE_HOST}:{system_port}{c.HEALTH_PATH}",
        waiting_for=f"registered in discovery ({c.HEALTH_PATH} on :{system_port})",
        gpus=gpus,
    )
