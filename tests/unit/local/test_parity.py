"""One pod contract: for random valid graphs (hypothesis), every process dynamo-run would start runs exactly
the command and environment the operator's render() gives its pod, modulo what a cluster gives a pod and
one machine does not (the pod's declared ports -> local ports, pod DNS names and 0.0.0.0 -> 127.0.0.1,
the downward API, $(VAR) expansion) and the engine (the module, the mocker's --model-dir, GPUs)."""

from __future__ import annotations

import itertools
import re

import yaml
from dynamo_api import contract as c
from dynamo_api import modules
from dynamo_api.models import DynamoGraphDeployment
from dynamo_api.validation import validate
from dynamo_operator.render import render
from dynamo_worker.local.kubelet import pods_of
from dynamo_worker.local.plan import local_config, machine_env, plan_graph
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

NATS = "nats://127.0.0.1:4999"
MACHINE = machine_env(http_host="127.0.0.1", grace_s=5, path="/venv/bin")
GPUS = tuple(str(i) for i in range(64))
ENV_NAMES = ["A", "B", c.ENV_NATS_SERVER, c.ENV_LOG_LEVEL, c.ENV_DISCOVERY_TTL, c.ENV_LISTEN_HOST]
ENV_VALUES = ["x", "$(POD_NAME)", "$(DYN_NAMESPACE)-y", "9090", "8000", "nats://other:4222", "$(UNKNOWN)"]


def envs(draw) -> list[dict[str, str]]:
    names = draw(st.lists(st.sampled_from(ENV_NAMES), unique=True, max_size=3))
    return [{"name": n, "value": draw(st.sampled_from(ENV_VALUES))} for n in names]


def container(draw, module: str, args: list[str]) -> dict:
    form = draw(st.sampled_from(["exec", "split", "shell", "args-only"]))
    if form == "exec":
        return {"command": ["python3", "-m", module], "args": args}
    if form == "split":
        return {"command": ["python3"], "args": ["-m", module, *args]}
    if form == "shell":
        return {"command": ["sh", "-c"], "args": [" ".join(["python3", "-m", module, *args])]}
    return {"args": args}  # the operator's default command


@st.composite
def graphs(draw) -> dict:
    page = draw(st.sampled_from(["16", "32"]))
    roles = draw(
        st.sampled_from([["agg"], ["agg", "agg"], ["prefill", "decode"], ["prefill", "decode", "decode"]])
    )
    frontend_args = draw(st.sampled_from([[], ["--router-mode", "kv"], ["--http-port", "8000"]]))
    services: dict = {
        "Frontend": {
            "componentType": "frontend",
            "envs": envs(draw),
            "extraPodSpec": {
                "mainContainer": container(
                    draw,
                    draw(st.sampled_from([modules.FRONTEND_MODULE, modules.DYNAMO_FRONTEND_MODULE])),
                    frontend_args,
                )
            },
        }
    }
    for i, role in enumerate(roles):
        gpus = draw(st.sampled_from([1, 2, 4]))
        nodes = draw(st.sampled_from([1, 2, 3]))
        # a split SGLang can make (validation's ParallelismMismatch): every GPU of several nodes, or at
        # most one node's; drawn valid, as filtering out three graphs in four failed the health check
        tp = nodes * gpus if nodes > 1 else draw(st.sampled_from([t for t in (1, 2, 4) if t <= gpus]))
        args = ["--model-path", "org/m", "--served-model-name", "org/m", "--page-size", page]
        args += ["--tp", str(tp)]
        if role != "agg":
            args += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "nixl"]
            args += ["--disaggregation-bootstrap-port", draw(st.sampled_from(["12345", "23456"]))]
            args += ["--host", "0.0.0.0"]
        service: dict = {
            "componentType": "worker",
            "replicas": draw(st.integers(0 if i else 1, 2)),
            "resources": {"limits": {"gpu": str(gpus)}},
            "envs": envs(draw),
            "extraPodSpec": {
                "mainContainer": container(
                    draw, draw(st.sampled_from([modules.SGLANG_MODULE, modules.DYNAMO_SGLANG_MODULE])), args
                )
            },
        }
        if role != "agg":
            service["subComponentType"] = role
        if nodes > 1:
            service["multinode"] = {"nodeCount": nodes}
        services[f"{role}{i}"] = service
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": draw(st.sampled_from(["g", "a-much-longer-graph-name"])), "namespace": "team"},
        "spec": {"backendFramework": "sglang", "envs": envs(draw), "services": services},
    }


def on_this_machine(text: str, ports: dict[int, int], peers: dict[str, dict[int, int]]) -> str:
    """The oracle's substitution: a pod's DNS name and 0.0.0.0 -> 127.0.0.1, a port after a pod's DNS
    name -> that pod's local port, any other port of this pod -> its local port."""
    for port, local in ports.items():  # a port after a pod's DNS name is that pod's: below
        text = re.sub(rf"(?<![\d.])(?<!\.svc:){port}(?!\d)", str(local), text)
    text = re.sub(r"([\w.-]+\.svc):(\d+)", lambda m: f"127.0.0.1:{peers[m[1]].get(int(m[2]), m[2])}", text)
    return re.sub(r"[\w.-]+\.svc\b", "127.0.0.1", text).replace("0.0.0.0", "127.0.0.1")


def expanded(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), text)


def engine_words(words: list[str], engine: str) -> list[str]:
    """The rendered command with the engine substituted: modules, and the mocker's --model-dir."""
    target = modules.MOCKER_MODULE if engine == "mocker" else modules.SGLANG_MODULE
    swaps = {
        modules.DYNAMO_SGLANG_MODULE: target,
        modules.SGLANG_MODULE: target,
        modules.DYNAMO_FRONTEND_MODULE: modules.FRONTEND_MODULE,
    }
    pattern = r"(?<=-m )(" + "|".join(re.escape(m) for m in swaps) + r")(?![\w.])"
    if words[0] == "sh":
        script = re.sub(pattern, lambda m: swaps[m[1]], words[2])
        if engine == "mocker" and f"-m {modules.FRONTEND_MODULE}" not in script:
            script += " --model-dir /tiny"
        return [*words[:2], script]
    out = [swaps.get(w, w) if i and words[i - 1] == "-m" else w for i, w in enumerate(words)]
    if engine == "mocker" and modules.FRONTEND_MODULE not in out:
        out += ["--model-dir", "/tiny"]
    return out


def field(path: str, pod: str, namespace: str) -> str:
    return {
        "metadata.name": pod,
        "metadata.namespace": namespace,
        "status.podIP": "127.0.0.1",
        "metadata.labels['apps.kubernetes.io/pod-index']": pod.rsplit("-", 1)[1],  # a StatefulSet ordinal
    }[path]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.sampled_from(["mocker", "sglang"]))
def test_every_process_runs_its_pods_rendered_command_and_env(manifest, engine):
    dgd = DynamoGraphDeployment.model_validate(yaml.safe_load(yaml.safe_dump(manifest)))
    assume(not validate(dgd))
    plan = plan_graph(
        dgd,
        engine=engine,
        nats_url=NATS,
        http_host="127.0.0.1",
        http_port=8123,
        mocker_model_dir="/tiny",
        sglang_model_path=None,
        gpus=GPUS,
        free_port=itertools.count(30000).__next__,
        machine=MACHINE,
    )
    pods = {p.name: p for p in pods_of(render(dgd, local_config(NATS)).objects)}
    peers = {pods[p.pod].dns_name: dict(p.ports) for p in plan.processes if pods[p.pod].dns_name}
    services = manifest["spec"]["services"]
    ranks = sum(s.get("replicas", 1) * s.get("multinode", {}).get("nodeCount", 1) for s in services.values())
    assert len(plan.processes) == ranks  # one frontend pod (replicas 1), and every rank of every worker
    assert len({p.pod for p in plan.processes}) == len(plan.processes)
    for proc in plan.processes:
        main = pods[proc.pod].main
        ports = dict(proc.ports)
        assert set(ports) == {p["containerPort"] for p in main.get("ports", [])}
        env = {}
        for item in main["env"]:
            if "value" in item:
                env[item["name"]] = on_this_machine(item["value"], ports, peers)
            else:
                env[item["name"]] = field(item["valueFrom"]["fieldRef"]["fieldPath"], proc.pod, "team")
        env = {name: expanded(value, env) for name, value in env.items()}
        if proc.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(proc.gpus)
        assert dict(proc.env) == {**MACHINE, **env}
        words = engine_words([*main.get("command", []), *main.get("args", [])], engine)
        assert list(proc.argv) == [expanded(on_this_machine(w, ports, peers), env) for w in words]
        if engine == "sglang" and proc.kind == "worker":
            assert len(proc.gpus) == int(main["resources"]["limits"]["nvidia.com/gpu"])
