"""dynamo_worker.local.plan: which local processes serve a manifest: the pods the operator's render()
makes, run with their rendered command and env (the operator's precedence: the user's env wins), free
ports, GPUs by resources.limits.gpu, multinode groups as their ranks, and clear refusals of what this
machine cannot run (the operator's own validation is tested in test_manifest.py)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from dynamo_api import contract as c
from dynamo_api import modules
from dynamo_worker.local.manifest import parse_manifest
from dynamo_worker.local.plan import PlanError, machine_env, plan_graph

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

REPO = Path(__file__).resolve().parents[3]
NATS = "nats://127.0.0.1:4999"
MACHINE = machine_env(http_host="127.0.0.1", grace_s=5, path="/venv/bin:/usr/bin")


def plan(text: str = DISAGG, **kw):
    args = {
        "engine": "mocker",
        "nats_url": NATS,
        "http_host": "127.0.0.1",
        "http_port": 8000,
        "mocker_model_dir": "/tiny",
        "sglang_model_path": None,
        "gpus": (),
        "free_port": itertools.count(20000).__next__,
        "machine": MACHINE,
    }
    args.update(kw)
    return plan_graph(parse_manifest(text), **args)


def test_disagg_on_the_mocker_runs_a_frontend_and_each_replica():
    p = plan()
    assert [x.name for x in p.processes] == ["Frontend-0", "decode-0", "prefill-0", "prefill-1"]
    assert [x.pod for x in p.processes][:2] == ["sglang-disagg-frontend-0", "sglang-disagg-decode-0"]
    assert p.url == "http://127.0.0.1:8000"
    assert p.served_models == ("Qwen/Qwen3-0.6B",)
    assert p.namespace == "default-sglang-disagg"


def test_the_frontend_runs_the_manifests_command_on_the_port_asked_for():
    fe = plan(http_port=8123).processes[0]
    assert fe.kind == "frontend"
    # dynamo.frontend is ours; its --http-port refers to its declared http port, which is --port here
    assert fe.argv == ("python3", "-m", modules.FRONTEND_MODULE, "--router-mode", "kv", "--http-port", "8123")
    assert fe.env[c.ENV_HTTP_PORT] == "8123"
    assert fe.health_url == "http://127.0.0.1:8123/health"
    assert fe.metrics_url == "http://127.0.0.1:8123/metrics" and fe.expected_workers == 3


def test_a_prefill_replica_runs_the_mocker_with_the_rendered_args_and_its_own_ports():
    prefill0 = plan().processes[2]
    bootstrap = prefill0.ports[12345]
    # the frontend routes on KV, so the operator gave the worker a KV events publisher (port kv-events)
    kv_port = prefill0.ports[c.KV_EVENTS_PORT]
    kv_events = f'{{"publisher":"zmq","endpoint":"tcp://*:{kv_port}"}}'
    assert prefill0.argv == (
        "python3", "-m", modules.MOCKER_MODULE, "--model-path", "Qwen/Qwen3-0.6B", "--served-model-name",
        "Qwen/Qwen3-0.6B", "--page-size", "16", "--tp", "1", "--skip-tokenizer-init",
        "--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "nixl",
        "--disaggregation-bootstrap-port", str(bootstrap), "--host", "127.0.0.1",
        "--kv-events-config", kv_events, "--model-dir", "/tiny",
    )  # fmt: skip
    assert prefill0.health_url == f"http://127.0.0.1:{prefill0.ports[c.SYSTEM_PORT]}/health"
    assert prefill0.gpus == ()


def test_replicas_never_share_a_port():
    used = [port for proc in plan().processes for port in proc.ports.values()]
    assert len(used) == len(set(used))
    assert all(proc.env[c.ENV_SYSTEM_PORT] == str(proc.ports[c.SYSTEM_PORT]) for proc in plan().processes[1:])


def test_prefill_replicas_without_a_bootstrap_port_each_get_their_own():
    """A manifest that sets no --disaggregation-bootstrap-port renders the contract's default on every
    prefill pod, which dynamo-run remaps like any declared port: two replicas on one host never collide."""
    text = DISAGG.replace('--disaggregation-bootstrap-port, "12345",\n                 ', "")
    assert "12345" not in text
    prefills = [x for x in plan(text).processes if x.service == "prefill"]
    ports = [x.argv[x.argv.index("--disaggregation-bootstrap-port") + 1] for x in prefills]
    assert len(prefills) == 2 and len(set(ports)) == 2
    assert ports == [str(x.ports[c.DEFAULT_BOOTSTRAP_PORT]) for x in prefills]


def test_a_worker_gets_the_operators_env_contract_and_the_manifests_envs():
    decode = plan().processes[1]
    assert decode.env[c.ENV_NAMESPACE] == "default-sglang-disagg"
    assert decode.env[c.ENV_COMPONENT] == "decode"
    assert decode.env[c.ENV_NATS_SERVER] == NATS
    assert decode.env[c.ENV_POD_NAME] == "sglang-disagg-decode-0"
    assert decode.env[c.ENV_ENDPOINT] == c.DEFAULT_ENDPOINT
    assert decode.env[c.ENV_ADVERTISE_HOST] == "127.0.0.1"  # $(POD_IP), the pod IP being the loopback
    assert decode.env[c.ENV_GRAPH_NAME] == "sglang-disagg"
    assert decode.env[c.ENV_LISTEN_HOST] == "127.0.0.1" and decode.env["PATH"] == "/venv/bin:/usr/bin"
    assert decode.env["SHARED"] == "graph"
    prefill = plan().processes[2]
    assert prefill.env["LEVEL"] == "service"  # a service's envs win over spec.envs
    # The operator's rule: the user's env wins over the contract's, on Kubernetes and here alike.
    assert prefill.env[c.ENV_NATS_SERVER] == "nats://elsewhere:4222"


def test_sglang_assigns_gpus_in_order_and_keeps_our_sglang_module():
    p = plan(engine="sglang", gpus=("4", "5", "6"))
    workers = p.processes[1:]
    assert [w.gpus for w in workers] == [("4",), ("5",), ("6",)]
    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in workers] == ["4", "5", "6"]
    commands = [" ".join(w.argv) for w in workers]  # decode's is a shell script: sh -c "python3 -m ..."
    assert all(f"-m {modules.SGLANG_MODULE} " in x and "--model-dir" not in x for x in commands)


def test_sglang_with_too_few_gpus_says_how_many_are_needed_and_what_to_do():
    with pytest.raises(PlanError) as e:
        plan(engine="sglang", gpus=("0", "1"))
    msg = str(e.value)
    assert "needs 3 GPUs" in msg and "prefill-0 needs 1" in msg and "2 are visible (0, 1)" in msg
    assert "--engine mocker" in msg


def test_engines_sharing_a_gpu_must_leave_each_other_room():
    """A GPU listed twice in CUDA_VISIBLE_DEVICES is shared by two engines. SGLang sizes each as a share
    of the whole GPU, so without --mem-fraction-static adding up to at most 0.9 the second cannot load."""
    with pytest.raises(PlanError) as e:
        plan(engine="sglang", gpus=("0", "0", "1"))  # decode-0 and prefill-0 on GPU 0
    msg = str(e.value)
    assert "decode-0, prefill-0 share GPU 0" in msg and "decode-0 unset, prefill-0 unset" in msg
    assert "--mem-fraction-static" in msg and "at most 0.9" in msg and "its own GPU" in msg
    roomy = DISAGG.replace("--host, 0.0.0.0]", "--host, 0.0.0.0, --mem-fraction-static, '0.45']")
    shared = plan(engine="sglang", gpus=("1", "0", "0"), text=roomy).processes[1:]  # the prefills share 0
    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in shared] == ["1", "0", "0"]
    greedy = roomy.replace("'0.45'", "'0.5'")
    with pytest.raises(PlanError, match=r"prefill-0 0\.5, prefill-1 0\.5"):
        plan(engine="sglang", gpus=("1", "0", "0"), text=greedy)


def test_sglang_model_dir_replaces_the_model_path():
    decode, prefill0 = plan(engine="sglang", gpus=("0", "1", "2"), sglang_model_path="/models/q").processes[
        1:3
    ]
    assert prefill0.argv[prefill0.argv.index("--model-path") + 1] == "/models/q"
    assert prefill0.argv.count("--model-path") == 1
    assert "--model-path /models/q " in decode.argv[2] and "Qwen/Qwen3-0.6B --served" not in decode.argv[2]


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


def test_multinode_runs_each_rank_with_its_rank_and_the_leader_on_this_machine():
    p = plan(MULTINODE)
    assert [x.name for x in p.processes] == ["Frontend-0", "worker-0", "worker-0-1"]
    assert p.namespace == "team-big"
    leader, rank1 = p.processes[1:]
    rendezvous = f"127.0.0.1:{leader.ports[c.DIST_INIT_PORT]}"  # the leader's port, in every rank
    for rank, proc in enumerate((leader, rank1)):
        tail = ("--dist-init-addr", rendezvous, "--nnodes", "2", "--node-rank", str(rank))
        assert proc.argv[-8:] == (*tail, "--model-dir", "/tiny")
        assert proc.env[c.ENV_NODE_RANK] == str(rank) and proc.env[c.ENV_LEADER_HOST] == "127.0.0.1"
    assert leader.health_url is not None and rank1.health_url is None  # only the leader is probed
    assert p.processes[0].expected_workers == 1  # only the leader registers


def test_multinode_on_sglang_gives_each_rank_its_gpus():
    p = plan(MULTINODE, engine="sglang", gpus=tuple(str(i) for i in range(8)))
    assert [x.gpus for x in p.processes[1:]] == [("0", "1", "2", "3"), ("4", "5", "6", "7")]
    with pytest.raises(PlanError, match=r"needs 8 GPUs.*worker-0 needs 4, worker-0-1 needs 4"):
        plan(MULTINODE, engine="sglang", gpus=("0", "1", "2", "3"))


def test_a_command_dynamo_run_cannot_map_is_refused_with_the_field():
    text = MULTINODE.replace(
        'command: [python3, -m, dynamo.sglang, --model-path, m, --tp-size, "8"]', "command: [/bin/serve]"
    )
    with pytest.raises(PlanError) as e:
        plan(text)
    assert "spec.services.worker.extraPodSpec.mainContainer.command" in str(e.value)
    assert "dynamo.sglang" in str(e.value)


def test_nvidia_dynamos_mocker_module_runs_ours_as_in_the_runtime_image():
    """The engine-swap table (dynamo_api.modules) maps dynamo.mocker to our mocker for the image and for
    dynamo-run alike: it stays the mocker whatever the engine."""
    text = MULTINODE.replace("dynamo.sglang", "dynamo.mocker")
    for engine in ("mocker", "sglang"):
        workers = [x for x in plan(text, engine=engine).processes if x.kind == "worker"]
        assert workers and all(x.argv[:3] == ("python3", "-m", modules.MOCKER_MODULE) for x in workers)


PLANNER = (REPO / "examples" / "disagg-planner.yaml").read_text()
GRAPH_FILE = "/graphs/disagg-planner.yaml"


def test_the_planner_runs_on_its_graph_file_and_the_local_frontends_metrics_in_dry_run():
    p = plan(PLANNER, graph_file=GRAPH_FILE)
    assert [x.name for x in p.processes] == ["Frontend-0", "Planner-0", "decode-0", "prefill-0"]
    frontend, planner = p.processes[:2]
    system = planner.ports[c.SYSTEM_PORT]
    config = planner.argv[planner.argv.index("--config") + 1]
    assert '"adjustment_interval": 60' in config  # the manifest's interval, as written
    assert planner.kind == "planner" and planner.argv == (
        "python3", "-m", "dynamo_worker.planner", "--profile", "builtin:sglang-8b-h100", "--config", config,
        "--graph-file", GRAPH_FILE, "--metrics-url", "http://127.0.0.1:8000/metrics", "--dry-run",
    )  # fmt: skip
    # the operator's env contract: its graph, its system port (a free local one), the loopback bind
    assert planner.env[c.ENV_GRAPH_NAME] == "sglang-disagg-planner"
    assert planner.env[c.ENV_GRAPH_NAMESPACE] == "default"
    assert planner.env[c.ENV_SYSTEM_PORT] == str(system) and system != c.SYSTEM_PORT
    assert planner.env[c.ENV_LISTEN_HOST] == "127.0.0.1"
    assert planner.metrics_url == f"http://127.0.0.1:{system}/metrics"
    assert planner.health_url is None and planner.gpus == ()  # no readinessProbe; no engine
    assert frontend.expected_workers == 2  # the planner is not a worker the frontend waits for
    (note,) = [n for n in p.notes if "Planner-0" in n]
    assert "cannot change the replicas of local processes, so the planner runs with --dry-run" in note
    assert "'Would scale ...'" in note and f"planner_* metrics on http://127.0.0.1:{system}/metrics" in note
    assert not any("skipped" in n for n in p.notes)


def test_the_planner_reads_the_frontends_port_even_where_it_is_the_pods_own_port_number():
    # flags are added after the kubelet's port substitution: 9090 here is the frontend's, not the pod's
    planner = plan(PLANNER, graph_file=GRAPH_FILE, http_port=c.SYSTEM_PORT).processes[1]
    assert planner.argv[planner.argv.index("--metrics-url") + 1] == "http://127.0.0.1:9090/metrics"
    assert planner.ports[c.SYSTEM_PORT] != c.SYSTEM_PORT


def test_flags_a_planner_already_sets_are_replaced_by_the_local_ones_once():
    text = PLANNER.replace(
        "            - --profile\n",
        "            - --metrics-url\n            - http://sglang-disagg-planner-frontend.default.svc:8000/metrics\n"
        "            - --dry-run\n            - --profile\n",
    )
    planner = plan(text, graph_file=GRAPH_FILE).processes[1]
    assert planner.argv.count("--metrics-url") == 1 and planner.argv.count("--dry-run") == 1
    assert planner.argv[planner.argv.index("--metrics-url") + 1] == "http://127.0.0.1:8000/metrics"


def test_nvidia_dynamos_planner_module_runs_ours():
    """Dynamo's manifests run `python3 -m dynamo.planner`: the runtime image maps it to our planner, and
    so does dynamo-run, with the same local flags."""
    dynamo = plan(PLANNER.replace("dynamo_worker.planner", "dynamo.planner"), graph_file=GRAPH_FILE)
    planner = dynamo.processes[1]
    assert planner.kind == "planner" and "dynamo_worker.planner" in planner.argv
    assert "dynamo.planner" not in planner.argv and "--dry-run" in planner.argv


def test_a_planner_with_no_manifest_file_is_skipped_with_a_note_naming_what_runs():
    no_file = plan(PLANNER)
    assert [x.name for x in no_file.processes] == ["Frontend-0", "decode-0", "prefill-0"]
    (note,) = [n for n in no_file.notes if "sglang-disagg-planner-planner-0" in n]
    assert "a planner runs here only as 'python3 -m dynamo_worker.planner ...'" in note
    assert "no manifest file" in note and note.endswith("not run locally (skipped)")


def test_planner_services_and_secrets_are_skipped_with_a_note():
    text = MULTINODE.replace(
        "    Frontend: {componentType: frontend}\n",
        "    Frontend: {componentType: frontend}\n"
        "    Planner: {componentType: planner, extraPodSpec: {mainContainer: {command: [planner]}}}\n",
    ).replace("      replicas: 1\n", "      replicas: 1\n      envFromSecret: hf-token\n")
    p = plan(text)
    assert any("hf-token" in n and "export" in n for n in p.notes)
    assert [x.name for x in p.processes] == ["Frontend-0", "worker-0", "worker-0-1"]
    assert any("big-planner-0" in n and "skipped" in n for n in p.notes)


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
    assert p.processes[0].argv == ("python3", "-m", modules.FRONTEND_MODULE, "--router-mode", "kv")
    assert p.processes[1].argv[:5] == ("python3", "-m", modules.MOCKER_MODULE, "--model-path", "m")
    assert p.served_models == ("served",)


def test_container_env_is_kept_and_value_from_is_skipped_with_a_note():
    text = ARGS_ONLY.replace(
        "extraPodSpec: {mainContainer: {args: [--model-path, m, --served-model-name, served]}}",
        "extraPodSpec: {mainContainer: {args: [--model-path, m], env: [{name: A, value: '1'}, "
        "{name: TOKEN, valueFrom: {secretKeyRef: {name: s, key: k}}}]}}",
    )
    p = plan(text)
    decode = p.processes[1]
    assert decode.env["A"] == "1" and "TOKEN" not in decode.env
    assert any("TOKEN" in n and "valueFrom" in n for n in p.notes)


def test_an_sglang_command_without_a_gpu_limit_is_refused_on_sglang():
    # The operator requires GPUs of workers only; another service running SGLang is refused here.
    text = ARGS_ONLY.replace(
        "    Frontend:\n",
        "    Engine:\n      componentType: planner\n"
        "      extraPodSpec: {mainContainer: {command: [python3, -m, dynamo.sglang, --model-path, m]}}\n"
        "    Frontend:\n",
    )
    assert [p.name for p in plan(text).processes] == ["Engine-0", "Frontend-0", "decode-0"]
    with pytest.raises(PlanError) as e:
        plan(text, engine="sglang", gpus=("0",))
    (problem,) = e.value.problems
    assert (problem.field, problem.reason) == ("spec.services.Engine.resources.limits.gpu", "MissingGpuLimit")
    assert str(e.value).startswith("spec.services.Engine.resources.limits.gpu: an SGLang worker needs GPUs")


def test_any_declared_port_is_remapped_wherever_it_is_referenced_and_other_numbers_are_kept():
    """A port the renderer (or the user's mainContainer) declares needs no code in dynamo-run: its
    references in env, flags, shell scripts and endpoints all follow it to the local port."""
    text = ARGS_ONLY.replace(
        "extraPodSpec: {mainContainer: {args: [--model-path, m, --served-model-name, served]}}",
        "extraPodSpec:\n"
        "        mainContainer:\n"
        "          ports: [{name: kv-events, containerPort: 5557}]\n"
        "          env: [{name: KV_PORT, value: '5557'}, {name: KV_ADDR, value: '$(POD_IP):5557'}]\n"
        "          args: [--model-path, m, --kv-events-port, '5557', --max-running-requests, '5557',\n"
        '                 --kv-events-config, \'{"endpoint": "tcp://*:5557"}\', --x-port=5557]',
    )
    decode = plan(text).processes[1]
    local = str(decode.ports[5557])
    assert local != "5557"
    assert decode.env["KV_PORT"] == local and decode.env["KV_ADDR"] == f"127.0.0.1:{local}"
    assert decode.argv[decode.argv.index("--kv-events-port") + 1] == local
    assert decode.argv[decode.argv.index("--max-running-requests") + 1] == "5557"  # not a port reference
    assert f'"tcp://*:{local}"' in decode.argv[decode.argv.index("--kv-events-config") + 1]
    assert f"--x-port={local}" in decode.argv


def test_a_graph_behind_a_gateway_is_refused_with_what_to_do():
    """An endpoint picker serves a Gateway API gateway, which dynamo-run does not run: refused, once."""
    with pytest.raises(PlanError) as e:
        plan((REPO / "examples" / "gateway.yaml").read_text())
    (problem,) = e.value.problems
    assert (problem.field, problem.reason) == ("spec.services.epp.componentType", "EppNotLocal")
    assert "remove the service to run the graph here" in problem.message
