"""dynamo_worker.local.plan (with manifest.graph_view): which local processes serve a manifest, with the
operator's env contract, free ports, GPUs by resources.limits.gpu, and clear refusals of what this
machine cannot run (the operator's own validation is tested in test_manifest.py)."""

from __future__ import annotations

import itertools

import pytest
from dynamo_operator.api import contract as c
from dynamo_worker.local.manifest import graph_view, parse_manifest
from dynamo_worker.local.plan import PlanError, plan_graph

DISAGG = """
apiVersion: nvidia.com/v1alpha1
kind: DynamoGraphDeployment
metadata:
  name: sglang-disagg
spec:
  backendFramework: sglang
  envs:
    - name: SHARED
      value: graph
    - name: LEVEL
      value: graph
  services:
    Frontend:
      componentType: frontend
      replicas: 1
      extraPodSpec:
        mainContainer:
          command: [python3, -m, dynamo.frontend]
          args: [--router-mode, kv, --http-port, "8000"]
    prefill:
      componentType: worker
      subComponentType: prefill
      replicas: 2
      envs:
        - name: LEVEL
          value: service
        - name: NATS_SERVER
          value: nats://elsewhere:4222
      resources:
        limits:
          gpu: "1"
      extraPodSpec:
        mainContainer:
          command: [python3]
          args: [-m, dynamo.sglang, --model-path, Qwen/Qwen3-0.6B, --served-model-name, Qwen/Qwen3-0.6B,
                 --page-size, "16", --tp, "1", --skip-tokenizer-init, --disaggregation-mode, prefill,
                 --disaggregation-transfer-backend, nixl, --disaggregation-bootstrap-port, "12345",
                 --host, 0.0.0.0]
    decode:
      componentType: worker
      subComponentType: decode
      replicas: 1
      resources:
        limits:
          gpu: 1
      extraPodSpec:
        mainContainer:
          command: [sh, -c]
          args: ["python3 -m dynamo.sglang --model-path Qwen/Qwen3-0.6B --served-model-name Qwen/Qwen3-0.6B
                  --page-size 16 --tp 1 --skip-tokenizer-init --disaggregation-mode decode
                  --disaggregation-transfer-backend nixl --host 0.0.0.0"]
"""

NATS = "nats://127.0.0.1:4999"


def plan(text: str = DISAGG, **kw):
    graph, _notes = graph_view(parse_manifest(text))
    args = {
        "engine": "mocker",
        "nats_url": NATS,
        "host": "127.0.0.1",
        "port": 8000,
        "python": "/py",
        "mocker_model_dir": "/tiny",
        "sglang_model_path": None,
        "gpus": (),
        "free_port": itertools.count(20000).__next__,
    }
    args.update(kw)
    return plan_graph(graph, **args)


def test_disagg_on_the_mocker_runs_a_frontend_and_each_replica():
    p = plan()
    assert [x.name for x in p.processes] == ["Frontend", "prefill-0", "prefill-1", "decode-0"]
    assert p.url == "http://127.0.0.1:8000"
    assert p.served_models == ("Qwen/Qwen3-0.6B",)
    assert p.namespace == "default-sglang-disagg"


def test_the_frontend_gets_our_module_the_port_and_the_manifests_router_mode():
    fe = plan().processes[0]
    assert fe.kind == "frontend"
    assert fe.argv == (
        "/py", "-m", c.FRONTEND_MODULE, "--http-host", "127.0.0.1", "--http-port", "8000",
        "--namespace", "default-sglang-disagg", "--nats-server", NATS, "--router-mode", "kv",
    )  # fmt: skip
    assert fe.health_url == "http://127.0.0.1:8000/health"
    assert fe.metrics_url == "http://127.0.0.1:8000/metrics" and fe.expected_workers == 3


def test_a_prefill_replica_gets_the_mocker_with_the_sglang_args_and_its_own_ports():
    prefill0 = plan().processes[1]
    assert prefill0.argv[:3] == ("/py", "-m", c.MOCKER_MODULE)
    assert prefill0.argv[3:] == (
        "--model-path", "Qwen/Qwen3-0.6B", "--served-model-name", "Qwen/Qwen3-0.6B", "--page-size", "16",
        "--tp", "1", "--skip-tokenizer-init", "--disaggregation-mode", "prefill",
        "--disaggregation-transfer-backend", "nixl",
        "--host", "127.0.0.1", "--port", "20000", "--disaggregation-bootstrap-port", "20001",
        "--model-dir", "/tiny",
    )  # fmt: skip
    assert prefill0.health_url == "http://127.0.0.1:20002/health"
    assert prefill0.gpus == ()


def test_replicas_never_share_a_port():
    used = []
    for proc in plan().processes[1:]:
        used += [proc.env[c.ENV_SYSTEM_PORT], proc.env[c.ENV_REQUEST_PORT]]
        used += [proc.argv[i + 1] for i, a in enumerate(proc.argv) if a.endswith("port")]
    assert len(used) == len(set(used))


def test_a_worker_gets_the_operators_env_contract_and_the_manifests_envs():
    decode = plan().processes[3]
    assert decode.env[c.ENV_NAMESPACE] == "default-sglang-disagg"
    assert decode.env[c.ENV_COMPONENT] == "decode"
    assert decode.env[c.ENV_NATS_SERVER] == NATS
    assert decode.env[c.ENV_POD_NAME] == "decode-0"
    assert decode.env[c.ENV_ENDPOINT] == c.DEFAULT_ENDPOINT
    assert decode.env[c.ENV_ADVERTISE_HOST] == "127.0.0.1"
    assert decode.env[c.ENV_GRAPH_NAME] == "sglang-disagg"
    assert decode.env["SHARED"] == "graph"
    prefill = plan().processes[1]
    assert prefill.env["LEVEL"] == "service"  # a service's envs win over spec.envs
    assert prefill.env[c.ENV_NATS_SERVER] == NATS  # the contract wins: it points at the embedded NATS


def test_sglang_assigns_gpus_in_order_and_keeps_our_sglang_module():
    p = plan(engine="sglang", gpus=("4", "5", "6"))
    workers = p.processes[1:]
    assert [w.gpus for w in workers] == [("4",), ("5",), ("6",)]
    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in workers] == ["4", "5", "6"]
    assert all(w.argv[2] == c.SGLANG_MODULE and "--model-dir" not in w.argv for w in workers)


def test_sglang_with_too_few_gpus_says_how_many_are_needed_and_what_to_do():
    with pytest.raises(PlanError) as e:
        plan(engine="sglang", gpus=("0", "1"))
    msg = str(e.value)
    assert "needs 3 GPUs" in msg and "prefill-0 needs 1" in msg and "2 are visible (0, 1)" in msg
    assert "--engine mocker" in msg


def test_sglang_model_dir_replaces_the_model_path():
    decode = plan(engine="sglang", gpus=("0", "1", "2"), sglang_model_path="/models/q").processes[3]
    assert decode.argv[decode.argv.index("--model-path") + 1] == "/models/q"
    assert decode.argv.count("--model-path") == 1


MULTINODE = """
apiVersion: nvidia.com/v1alpha1
kind: DynamoGraphDeployment
metadata: {name: big, namespace: team}
spec:
  services:
    Frontend: {componentType: frontend}
    worker:
      componentType: worker
      replicas: 1
      multinode: {nodeCount: 2}
      resources: {limits: {gpu: "4"}}
      extraPodSpec:
        mainContainer:
          command: [python3, -m, dynamo.sglang, --model-path, m, --tp-size, "8"]
"""


def test_multinode_runs_one_process_per_group_and_says_so():
    p = plan(MULTINODE)
    assert [x.name for x in p.processes] == ["Frontend", "worker-0"]
    assert p.namespace == "team-big"
    assert any("one process per group" in n and "mocker" in n for n in p.notes)


def test_multinode_on_sglang_takes_node_count_times_gpus():
    p = plan(MULTINODE, engine="sglang", gpus=tuple(str(i) for i in range(8)))
    assert p.processes[1].gpus == tuple(str(i) for i in range(8))
    with pytest.raises(PlanError, match="needs 8 GPUs"):
        plan(MULTINODE, engine="sglang", gpus=("0", "1", "2", "3"))


def test_a_command_dynamo_run_cannot_map_is_refused_with_the_field():
    text = MULTINODE.replace(
        'command: [python3, -m, dynamo.sglang, --model-path, m, --tp-size, "8"]', "command: [/bin/serve]"
    )
    with pytest.raises(PlanError) as e:
        plan(text)
    assert "spec.services.worker.extraPodSpec.mainContainer.command" in str(e.value)
    assert "dynamo.sglang" in str(e.value)


def test_planner_services_and_secrets_are_skipped_with_a_note():
    text = MULTINODE.replace(
        "    Frontend: {componentType: frontend}\n",
        "    Frontend: {componentType: frontend}\n"
        "    Planner: {componentType: planner, extraPodSpec: {mainContainer: {command: [planner]}}}\n",
    ).replace("      replicas: 1\n", "      replicas: 1\n      envFromSecret: hf-token\n")
    p = plan(text)
    assert any("hf-token" in n and "export" in n for n in p.notes)
    assert [x.name for x in p.processes] == ["Frontend", "worker-0"]
    assert any("Planner" in n and "skipped" in n for n in p.notes)


ARGS_ONLY = """
apiVersion: nvidia.com/v1alpha1
kind: DynamoGraphDeployment
metadata: {name: r}
spec:
  services:
    Frontend:
      componentType: frontend
      extraPodSpec: {mainContainer: {args: [--router-mode, kv]}}
    decode:
      componentType: worker
      resources: {limits: {gpu: "1"}}
      extraPodSpec: {mainContainer: {args: [--model-path, m, --served-model-name, served]}}
"""


def test_args_without_command_run_the_operators_default_command():
    p = plan(ARGS_ONLY)
    assert p.processes[0].argv[-2:] == ("--router-mode", "kv")
    assert p.processes[1].argv[:5] == ("/py", "-m", c.MOCKER_MODULE, "--model-path", "m")
    assert p.served_models == ("served",)


def test_container_env_is_kept_and_value_from_is_skipped_with_a_note():
    text = ARGS_ONLY.replace(
        "extraPodSpec: {mainContainer: {args: [--model-path, m, --served-model-name, served]}}",
        "extraPodSpec: {mainContainer: {args: [--model-path, m], env: [{name: A, value: '1'}, "
        "{name: TOKEN, valueFrom: {secretKeyRef: {name: s, key: k}}}]}}",
    )
    graph, notes = graph_view(parse_manifest(text))
    decode = plan(text).processes[1]
    assert decode.env["A"] == "1" and "TOKEN" not in decode.env
    assert any("TOKEN" in n and "valueFrom" in n for n in notes)
    assert graph.services[1].envs == (("A", "1"),)


def test_an_sglang_command_without_a_gpu_limit_is_refused_on_sglang():
    # The operator requires GPUs of workers only; another service running SGLang is refused here.
    text = ARGS_ONLY.replace(
        "    Frontend:\n",
        "    Engine:\n      componentType: planner\n"
        "      extraPodSpec: {mainContainer: {command: [python3, -m, dynamo.sglang, --model-path, m]}}\n"
        "    Frontend:\n",
    )
    assert [p.name for p in plan(text).processes] == ["Engine-0", "Frontend", "decode-0"]
    with pytest.raises(PlanError) as e:
        plan(text, engine="sglang", gpus=("0",))
    (problem,) = e.value.problems
    assert (problem.field, problem.reason) == ("spec.services.Engine.resources.limits.gpu", "MissingGpuLimit")
    assert str(e.value).startswith("spec.services.Engine.resources.limits.gpu: an SGLang worker needs GPUs")


def test_sglang_prefill_workers_choose_their_own_bootstrap_port():
    """Our SGLang worker picks a free port itself and retries when SGLang could not bind it; a port
    chosen by dynamo-run would sit unbound (and could be taken) while the weights load."""
    workers = plan(engine="sglang", gpus=("0", "1", "2")).processes[1:]
    assert [w.name for w in workers] == ["prefill-0", "prefill-1", "decode-0"]
    assert all("--disaggregation-bootstrap-port" not in w.argv for w in workers)
    assert all("--disaggregation-mode" in w.argv for w in workers)
