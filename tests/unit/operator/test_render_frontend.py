"""Rendering a frontend service: Deployment + Service on port 8000, default command, probes, env
contract, ownerReferences; and the render contract (determinism, no owner without a uid)."""

from __future__ import annotations

import json

from dynamo_api.models import DynamoGraphDeployment
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render

CONFIG = OperatorConfig(nats_url="nats://nats.dynamo:4222", frontend_image="img/frontend:1")
WORKER = {
    "componentType": "worker",
    "resources": {"limits": {"gpu": "1"}},
    "extraPodSpec": {"mainContainer": {"args": ["--model-path", "m"]}},
}


def _dgd(frontend: dict, uid: str | None = "uid-1") -> DynamoGraphDeployment:
    meta = {"name": "g", "namespace": "ns"} | ({"uid": uid} if uid else {})
    return DynamoGraphDeployment.model_validate(
        {"metadata": meta, "spec": {"services": {"Frontend": frontend, "decode": WORKER}}}
    )


LABELS = {
    "app.kubernetes.io/managed-by": "dynamo-sglang-operator",
    "nvidia.com/dynamo-graph-deployment-name": "g",
    "nvidia.com/dynamo-component": "Frontend",
    "nvidia.com/dynamo-component-type": "frontend",
}
SELECTOR = {"nvidia.com/dynamo-graph-deployment-name": "g", "nvidia.com/dynamo-component": "Frontend"}
OWNER = [
    {
        "apiVersion": "nvidia.com/v1beta1",  # owners are named by the stored version
        "kind": "DynamoGraphDeployment",
        "name": "g",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
]
META = {"name": "g-frontend", "namespace": "ns", "labels": LABELS, "ownerReferences": OWNER}
ENV = [
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    {"name": "DYN_NAMESPACE", "value": "ns-g"},
    {"name": "DYN_COMPONENT", "value": "Frontend"},
    {"name": "DYN_PARENT_DGD_K8S_NAME", "value": "g"},
    {"name": "DYN_PARENT_DGD_K8S_NAMESPACE", "value": "ns"},
    {"name": "NATS_SERVER", "value": "nats://nats.dynamo:4222"},
    {"name": "DYN_DISCOVERY_TTL", "value": "10"},
    {"name": "DYN_LOG_FORMAT", "value": "json"},
    {"name": "DYN_HTTP_PORT", "value": "8000"},
    {"name": "DYN_GRAPH_MODELS", "value": "m"},  # the workers' served model (render.revision)
]


def _probe(path: str, failures: int = 3) -> dict:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def test_frontend_objects():
    rendered = render(_dgd({"componentType": "frontend", "replicas": 2}), CONFIG)
    assert rendered.problems == ()
    service, deployment = rendered.objects[:2]
    assert service == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": META,
        "spec": {
            "type": "ClusterIP",
            "selector": SELECTOR,
            "ports": [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    assert deployment == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": META,
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": SELECTOR},
            "template": {
                "metadata": {"labels": LABELS},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "img/frontend:1",
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["python3", "-m", "dynamo_worker.frontend"],
                            "env": ENV,
                            "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                            "volumeMounts": [{"name": "shared-memory", "mountPath": "/dev/shm"}],
                            "livenessProbe": _probe("/live"),
                            "readinessProbe": _probe("/health"),
                            "startupProbe": _probe("/live", 12),  # liveness waits for the first answer
                        }
                    ],
                    "volumes": [
                        {"name": "shared-memory", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}
                    ],
                },
            },
        },
    }
    plan = rendered.services["Frontend"]
    assert (plan.kind, plan.replicas, plan.children, plan.services) == (
        "Deployment",
        2,
        ("g-frontend",),
        ("g-frontend",),
    )


def test_frontend_args_go_to_the_default_command_and_user_env_wins():
    rendered = render(
        _dgd(
            {
                "componentType": "frontend",
                "envs": [{"name": "DYN_HTTP_PORT", "value": "8080"}, {"name": "EXTRA", "value": "1"}],
                "extraPodSpec": {"mainContainer": {"args": ["--router-mode", "kv"]}},
            }
        ),
        CONFIG,
    )
    container = rendered.objects[1]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python3", "-m", "dynamo_worker.frontend"]
    assert container["args"] == ["--router-mode", "kv"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DYN_HTTP_PORT"] == "8080" and env["EXTRA"] == "1"
    assert [e["name"] for e in container["env"]][-1] == "EXTRA", "an overridden name keeps its place"


def test_dynamo_frontend_module_swapped_only_when_asked():
    frontend = {
        "componentType": "frontend",
        "extraPodSpec": {"mainContainer": {"command": ["python3", "-m", "dynamo.frontend"]}},
    }
    kept = render(_dgd(frontend), CONFIG)
    assert kept.objects[1]["spec"]["template"]["spec"]["containers"][0]["command"][2] == "dynamo.frontend"
    dgd = _dgd(frontend).model_copy(deep=True)
    body = dgd.model_dump(by_alias=True, exclude_none=True)
    body["metadata"]["annotations"] = {"nvidia.com/dynamo-worker-module": "dynamo_worker.sglang"}
    swapped = render(DynamoGraphDeployment.model_validate(body), CONFIG)
    assert (
        swapped.objects[1]["spec"]["template"]["spec"]["containers"][0]["command"][2]
        == "dynamo_worker.frontend"
    )
    assert "ModuleSwapped" in {n.reason for n in swapped.notices}


def test_render_is_deterministic_and_owner_needs_a_uid():
    first = render(_dgd({"componentType": "frontend"}), CONFIG)
    second = render(_dgd({"componentType": "frontend"}), CONFIG)
    assert json.dumps(first.objects) == json.dumps(second.objects)
    local = render(_dgd({"componentType": "frontend"}, uid=None), CONFIG)
    assert all("ownerReferences" not in o["metadata"] for o in local.objects)
