"""Rendering single-node workers: the Deployment and main container (ports, probes, GPU limit, /dev/shm,
env contract), each override (envs, envFromSecret, extraPodSpec, probes, resources, volumes, labels),
disaggregation wiring (bootstrap port, --host), RDMA, notices, and long names."""

from __future__ import annotations

import copy

from dynamo_api.models import DynamoGraphDeployment
from dynamo_api.sglang_args import flag_value
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render

CONFIG = OperatorConfig(nats_url="nats://nats:4222", worker_image="img/worker:1", startup_timeout_s=600)
ARGS = ["--model-path", "Qwen/Qwen3-0.6B", "--page-size", "16", "--tp", "1"]


def _worker(**overrides) -> dict:
    base = {
        "componentType": "worker",
        "resources": {"limits": {"gpu": "1"}},
        "extraPodSpec": {
            "mainContainer": {"command": ["python3", "-m", "dynamo_worker.sglang"], "args": ARGS}
        },
    }
    base.update(overrides)
    return base


def _render(services: dict, annotations: dict | None = None, envs: list | None = None, name: str = "g"):
    body = {
        "metadata": {"name": name, "namespace": "ns", "uid": "u", "annotations": annotations or {}},
        "spec": {"services": {"Frontend": {"componentType": "frontend"}, **services}, "envs": envs or []},
    }
    return render(DynamoGraphDeployment.model_validate(body), CONFIG)


def _deployment(rendered, name: str) -> dict:
    return next(o for o in rendered.objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name)


def _main(rendered, name: str) -> dict:
    return _deployment(rendered, name)["spec"]["template"]["spec"]["containers"][0]


def _probe(path: str, failures: int) -> dict:
    return {
        "httpGet": {"path": path, "port": "system"},
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def test_worker_deployment_and_container():
    rendered = _render({"decode": _worker(replicas=3)})
    assert rendered.problems == () and rendered.notices == ()
    deployment = _deployment(rendered, "g-decode")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["selector"] == {
        "matchLabels": {
            "nvidia.com/dynamo-graph-deployment-name": "g",
            "nvidia.com/dynamo-component": "decode",
        }
    }
    assert (
        deployment["spec"]["template"]["metadata"]["labels"]["nvidia.com/dynamo-component-type"] == "worker"
    )
    assert _main(rendered, "g-decode") == {
        "name": "main",
        "image": "img/worker:1",
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-m", "dynamo_worker.sglang"],
        "args": ARGS,
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "DYN_NAMESPACE", "value": "ns-g"},
            {"name": "DYN_COMPONENT", "value": "decode"},
            {"name": "DYN_PARENT_DGD_K8S_NAME", "value": "g"},
            {"name": "DYN_PARENT_DGD_K8S_NAMESPACE", "value": "ns"},
            {"name": "NATS_SERVER", "value": "nats://nats:4222"},
            {"name": "DYN_DISCOVERY_TTL", "value": "10"},
            {"name": "DYN_LOG_FORMAT", "value": "json"},
            {"name": "DYN_SYSTEM_ENABLED", "value": "true"},
            {"name": "DYN_SYSTEM_PORT", "value": "9090"},
            {"name": "DYN_ENDPOINT", "value": "generate"},
            {"name": "DYN_REQUEST_PORT", "value": "9100"},
            {"name": "DYN_ADVERTISE_HOST", "value": "$(POD_IP)"},
        ],
        "ports": [
            {"name": "system", "containerPort": 9090, "protocol": "TCP"},
            {"name": "request", "containerPort": 9100, "protocol": "TCP"},
        ],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        "volumeMounts": [{"name": "shared-memory", "mountPath": "/dev/shm"}],
        "livenessProbe": _probe("/live", 3),
        "readinessProbe": _probe("/health", 3),
        "startupProbe": _probe("/health", 60),
    }
    plan = rendered.services["decode"]
    assert (plan.role, plan.kind, plan.nodes_per_replica, plan.transport) == ("agg", "Deployment", 1, "tcp")


def test_worker_without_command_runs_our_sglang_module():
    service = _worker()
    del service["extraPodSpec"]["mainContainer"]["command"]
    assert _main(_render({"decode": service}), "g-decode")["command"] == [
        "python3",
        "-m",
        "dynamo_worker.sglang",
    ]


def test_resources_gpu_type_custom_requests_and_claims():
    service = _worker(
        resources={
            "requests": {"cpu": "4", "memory": "16Gi", "custom": {"ephemeral-storage": "2Gi"}},
            "limits": {"gpu": 2, "gpuType": "gpu.intel.com/xe", "memory": "32Gi", "custom": {"rdma/ib": "1"}},
        }
    )
    assert _main(_render({"decode": service}), "g-decode")["resources"] == {
        "requests": {"cpu": "4", "memory": "16Gi", "ephemeral-storage": "2Gi"},
        "limits": {"memory": "32Gi", "gpu.intel.com/xe": "2", "rdma/ib": "1"},
    }


def test_envs_service_wins_over_graph_and_main_container_wins_over_both():
    service = _worker(
        envs=[{"name": "A", "value": "service"}, {"name": "B", "value": "service"}], envFromSecret="hf"
    )
    service["extraPodSpec"]["mainContainer"]["env"] = [{"name": "B", "value": "container"}]
    graph_envs = [
        {"name": "A", "value": "graph"},
        {"name": "C", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
    ]
    container = _main(_render({"decode": service}, envs=graph_envs), "g-decode")
    env = {e["name"]: e for e in container["env"]}
    assert env["A"] == {"name": "A", "value": "service"}
    assert env["B"] == {"name": "B", "value": "container"}
    assert env["C"] == {"name": "C", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    assert container["envFrom"] == [{"secretRef": {"name": "hf"}}]


def test_extra_pod_spec_merge_user_wins():
    service = _worker(
        livenessProbe={"tcpSocket": {"port": "system"}, "periodSeconds": 30},
        extraPodSpec={
            "mainContainer": {
                "image": "mine:2",
                "command": ["sh", "-c"],
                "args": ["python3 -m dynamo_worker.sglang --tp 1"],
                "workingDir": "/w",
                "ports": [{"name": "system", "containerPort": 9191}],
                "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                "securityContext": {"runAsUser": 1000},
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 9191}},
            },
            "nodeSelector": {"gpu": "h100"},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "volumes": [{"name": "cache", "hostPath": {"path": "/cache"}}],
            "containers": [{"name": "sidecar", "image": "side:1"}],
            "serviceAccountName": "sa",
        },
    )
    rendered = _render({"decode": service})
    pod = _deployment(rendered, "g-decode")["spec"]["template"]["spec"]
    main, sidecar = pod["containers"]
    assert sidecar == {"name": "sidecar", "image": "side:1"}
    assert (main["image"], main["command"], main["args"], main["workingDir"]) == (
        "mine:2",
        ["sh", "-c"],
        ["python3 -m dynamo_worker.sglang --tp 1"],
        "/w",
    )
    assert main["ports"][0] == {"name": "system", "containerPort": 9191, "protocol": "TCP"}
    assert main["volumeMounts"] == [
        {"name": "shared-memory", "mountPath": "/dev/shm"},
        {"name": "cache", "mountPath": "/cache"},
    ]
    assert main["securityContext"] == {"runAsUser": 1000}
    assert main["livenessProbe"] == {"tcpSocket": {"port": "system"}, "periodSeconds": 30}
    assert main["readinessProbe"] == {"httpGet": {"path": "/ready", "port": 9191}}
    assert pod["nodeSelector"] == {"gpu": "h100"} and pod["serviceAccountName"] == "sa"
    assert pod["volumes"][-1] == {"name": "cache", "hostPath": {"path": "/cache"}}


def test_shared_memory_size_and_disabled():
    sized = _deployment(_render({"decode": _worker(sharedMemory={"size": "32Gi"})}), "g-decode")
    assert sized["spec"]["template"]["spec"]["volumes"] == [
        {"name": "shared-memory", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}}
    ]
    off = _deployment(_render({"decode": _worker(sharedMemory={"disabled": True})}), "g-decode")
    assert "volumes" not in off["spec"]["template"]["spec"]
    assert off["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] == []


def test_pvcs_mounted_and_created():
    body = {
        "metadata": {"name": "g", "namespace": "ns", "uid": "u"},
        "spec": {
            "pvcs": [
                {
                    "name": "models",
                    "create": True,
                    "size": "100Gi",
                    "storageClass": "fast",
                    "volumeAccessMode": "ReadWriteMany",
                },
                {"name": "existing"},
            ],
            "services": {
                "Frontend": {"componentType": "frontend"},
                "decode": _worker(
                    volumeMounts=[
                        {"name": "models", "mountPoint": "/models"},
                        {"name": "existing", "mountPoint": "/e"},
                    ]
                ),
            },
        },
    }
    rendered = render(DynamoGraphDeployment.model_validate(body), CONFIG)
    pvc = rendered.objects[0]
    assert pvc["kind"] == "PersistentVolumeClaim" and pvc["metadata"]["name"] == "models"
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "fast",
        "resources": {"requests": {"storage": "100Gi"}},
    }
    assert [o["kind"] for o in rendered.objects].count("PersistentVolumeClaim") == 1
    pod = _deployment(rendered, "g-decode")["spec"]["template"]["spec"]
    assert pod["volumes"][1:] == [
        {"name": "models", "persistentVolumeClaim": {"claimName": "models"}},
        {"name": "existing", "persistentVolumeClaim": {"claimName": "existing"}},
    ]
    assert pod["containers"][0]["volumeMounts"][1:] == [
        {"name": "models", "mountPath": "/models"},
        {"name": "existing", "mountPath": "/e"},
    ]


def test_labels_annotations_and_extra_pod_metadata():
    service = _worker(
        labels={"team": "a", "nvidia.com/dynamo-component": "spoof"},
        annotations={"note": "x"},
        extraPodMetadata={"labels": {"pod-only": "y"}, "annotations": {"prometheus.io/scrape": "true"}},
    )
    deployment = _deployment(_render({"decode": service}), "g-decode")
    assert deployment["metadata"]["labels"]["team"] == "a"
    assert deployment["metadata"]["labels"]["nvidia.com/dynamo-component"] == "decode", "ours win"
    assert deployment["metadata"]["annotations"] == {"note": "x"}
    template = deployment["spec"]["template"]["metadata"]
    assert template["labels"]["pod-only"] == "y" and template["labels"]["team"] == "a"
    assert template["annotations"] == {"note": "x", "prometheus.io/scrape": "true"}


def _disagg(prefill_args: list[str], decode_args: list[str]) -> dict:
    def svc(role: str, args: list[str]) -> dict:
        return _worker(
            subComponentType=role,
            extraPodSpec={"mainContainer": {"command": ["python3", "-m", "dynamo.sglang"], "args": args}},
        )

    return {"prefill": svc("prefill", prefill_args), "decode": svc("decode", decode_args)}


def test_disaggregation_bootstrap_port_and_host():
    flags = ["--page-size", "16", "--disaggregation-transfer-backend", "nixl"]
    rendered = _render(
        _disagg(
            [*flags, "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "12345"],
            [*flags, "--disaggregation-mode", "decode", "--host", "127.0.0.1"],
        )
    )
    assert rendered.problems == ()
    prefill, decode = _main(rendered, "g-prefill"), _main(rendered, "g-decode")
    assert prefill["ports"][-1] == {"name": "bootstrap", "containerPort": 12345, "protocol": "TCP"}
    assert prefill["args"][-2:] == ["--host", "0.0.0.0"]
    assert decode["args"][-2:] == ["--host", "0.0.0.0"]
    assert [p["name"] for p in decode["ports"]] == ["system", "request"]
    reasons = [(n.reason, n.service, n.warning) for n in rendered.notices]
    assert ("HostOverridden", "decode", True) in reasons
    assert ("TcpTransport", None, False) in reasons
    assert rendered.services["prefill"].role == "prefill"


def test_prefill_default_bootstrap_port():
    """A prefill worker whose manifest sets no bootstrap port binds SGLang's default, made explicit: the
    port it binds is the port it declares (and what remaps a pod's ports remaps it too)."""
    rendered = _render(_disagg(["--disaggregation-mode", "prefill"], ["--disaggregation-mode", "decode"]))
    prefill, decode = _main(rendered, "g-prefill"), _main(rendered, "g-decode")
    assert prefill["ports"][-1] == {"name": "bootstrap", "containerPort": 8998, "protocol": "TCP"}
    assert flag_value(prefill["args"], "--disaggregation-bootstrap-port") == "8998"
    assert flag_value(decode["args"], "--disaggregation-bootstrap-port") is None
    assert not [n for n in rendered.notices if n.service == "prefill"]


def test_rdma_graph_annotation_wires_pods_and_states_transport():
    nixl = ["--disaggregation-transfer-backend", "nixl"]
    rendered = _render(
        _disagg(["--disaggregation-mode", "prefill", *nixl], ["--disaggregation-mode", "decode", *nixl]),
        annotations={
            "nvidia.com/rdma": "true",
            "nvidia.com/ucx-net-devices": "mlx5_0:1",
            "nvidia.com/rdma-host-network": "true",
        },
    )
    pod = _deployment(rendered, "g-prefill")["spec"]["template"]["spec"]
    main = pod["containers"][0]
    assert main["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert main["resources"] == {
        "limits": {"nvidia.com/gpu": "1", "rdma/ib": "1"},
        "requests": {"rdma/ib": "1"},
    }
    assert main["env"][-2:] == [
        {"name": "UCX_TLS", "value": "rc,cuda_copy,cuda_ipc"},
        {"name": "UCX_NET_DEVICES", "value": "mlx5_0:1"},
    ]
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    frontend = _deployment(rendered, "g-frontend")["spec"]["template"]["spec"]
    assert "hostNetwork" not in frontend
    (transport,) = [n for n in rendered.notices if n.reason.endswith("Transport")]
    assert transport.reason == "RdmaTransport"
    assert transport.message == (
        "Pods of decode, prefill are configured for NIXL over RDMA "
        "(IPC_LOCK, 1 x rdma/ib, UCX_TLS=rc,cuda_copy,cuda_ipc, UCX_NET_DEVICES=mlx5_0:1, hostNetwork)."
    )
    assert rendered.services["decode"].transport == "rdma"


def test_rdma_service_opt_out_is_mixed():
    services = _disagg(["--disaggregation-mode", "prefill"], ["--disaggregation-mode", "decode"])
    services["decode"]["annotations"] = {"nvidia.com/rdma": "false"}
    rendered = _render(services, annotations={"nvidia.com/rdma": "true"})
    reasons = [n.reason for n in rendered.notices if n.reason.endswith("Transport")]
    assert reasons == ["MixedTransport"]
    assert "securityContext" not in _main(rendered, "g-decode")


def test_dynamo_module_kept_unless_annotation():
    service = _worker(
        extraPodSpec={"mainContainer": {"command": ["python3", "-m", "dynamo.sglang"], "args": ARGS}}
    )
    kept = _main(_render({"decode": service}), "g-decode")
    assert kept["command"] == ["python3", "-m", "dynamo.sglang"]
    swapped = _render(
        {"decode": service}, annotations={"nvidia.com/dynamo-worker-module": "dynamo_worker.mocker"}
    )
    assert _main(swapped, "g-decode")["command"] == ["python3", "-m", "dynamo_worker.mocker"]


def test_tp_mismatch_single_node_warns_when_gpus_idle_and_refuses_when_too_few():
    service = _worker()
    service["resources"]["limits"]["gpu"] = "4"
    service["extraPodSpec"]["mainContainer"]["args"] = ["--tp", "2"]
    (notice,) = _render({"decode": service}).notices
    assert (notice.reason, notice.service, notice.warning) == ("TpMismatch", "decode", True)
    assert "--tp 2" in notice.message and "= 4" in notice.message
    service["resources"]["limits"]["gpu"] = "1"
    (problem,) = _render({"decode": service}).problems
    assert (problem.reason, problem.field) == (
        "ParallelismMismatch",
        "spec.services.decode.extraPodSpec.mainContainer.args",
    )
    assert "on 1 GPUs: it cannot start; set --tp to 1 or resources.limits.gpu to 2." in problem.message


def test_ignored_dynamo_fields_and_generic_components():
    planner = {
        "componentType": "planner",
        "extraPodSpec": {"mainContainer": {"command": ["python3", "-m", "dynamo.planner"]}},
    }
    rendered = _render(
        {"decode": _worker(dynamoNamespace="old", ingress={"enabled": True}), "Planner": planner}
    )
    assert rendered.problems == ()
    reasons = {(n.reason, n.service) for n in rendered.notices}
    assert ("IgnoredFields", "decode") in reasons and ("RunAsGiven", "Planner") in reasons
    main = _main(rendered, "g-planner")
    assert main["command"] == ["python3", "-m", "dynamo.planner"]
    assert "livenessProbe" not in main and "startupProbe" not in main


def test_long_names_are_truncated_with_a_hash():
    name = "a" * 70
    rendered = _render({"decode": _worker()}, name=name)
    names = [o["metadata"]["name"] for o in rendered.objects]
    assert all(len(n) <= 52 for n in names)
    assert names[0].startswith("a" * 40) and names[0] != names[-1]
    assert _render({"decode": _worker()}, name=name).objects == rendered.objects
    labels = rendered.objects[0]["metadata"]["labels"]
    assert len(labels["nvidia.com/dynamo-graph-deployment-name"]) == 63


def test_inputs_not_mutated():
    service = _worker()
    before = copy.deepcopy(service)
    _render({"decode": service})
    assert service == before
