"""What a v1beta1 component's podTemplate says reaches its pods: the main container's image, command,
args, env (after spec.env), envFrom and resources (nvidia.com/gpu, ephemeral-storage); the pod's volumes
and sidecars; sharedMemorySize "0" means no /dev/shm."""

from __future__ import annotations

from dynamo_api.conversion import load_graph
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render

GRAPH = {
    "apiVersion": "nvidia.com/v1beta1",
    "kind": "DynamoGraphDeployment",
    "metadata": {"name": "g", "namespace": "ns", "uid": "u-1"},
    "spec": {
        "env": [{"name": "SHARED", "value": "graph"}, {"name": "OVERRIDE", "value": "graph"}],
        "components": [
            {
                "name": "Frontend",
                "type": "frontend",
                "podTemplate": {"spec": {"containers": [{"name": "main"}]}},
            },
            {
                "name": "decode",
                "type": "worker",
                "replicas": 2,
                "sharedMemorySize": "0",
                "podTemplate": {
                    "metadata": {"labels": {"team": "a"}},
                    "spec": {
                        "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models"}}],
                        "containers": [
                            {
                                "name": "main",
                                "image": "ghcr.io/dynamo-sglang/dynamo-sglang:0.1.0",
                                "command": ["python3", "-m", "dynamo_worker.sglang"],
                                "args": ["--model-path", "m", "--tp", "1"],
                                "env": [{"name": "OVERRIDE", "value": "component"}],
                                "envFrom": [{"secretRef": {"name": "hf-token"}}],
                                "resources": {
                                    "limits": {"nvidia.com/gpu": "1"},
                                    "requests": {"ephemeral-storage": "2Gi"},
                                },
                                "volumeMounts": [{"name": "models", "mountPath": "/models"}],
                            },
                            {"name": "sidecar", "image": "busybox:1.37"},
                        ],
                    },
                },
            },
        ],
    },
}


def _decode_pod() -> dict:
    rendered = render(load_graph(GRAPH), OperatorConfig())
    assert rendered.problems == ()
    (deployment,) = [
        o for o in rendered.objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "g-decode"
    ]
    assert deployment["spec"]["replicas"] == 2
    return deployment["spec"]["template"]


def test_main_container_carries_the_podtemplate_settings():
    template = _decode_pod()
    main = next(c for c in template["spec"]["containers"] if c["name"] == "main")
    assert main["image"] == "ghcr.io/dynamo-sglang/dynamo-sglang:0.1.0"
    assert main["command"] == ["python3", "-m", "dynamo_worker.sglang"]
    assert main["args"][:4] == ["--model-path", "m", "--tp", "1"]
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert main["resources"]["requests"]["ephemeral-storage"] == "2Gi"
    assert {"secretRef": {"name": "hf-token"}} in main["envFrom"]
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["SHARED"] == "graph" and env["OVERRIDE"] == "component"  # spec.env first, the component wins
    assert template["metadata"]["labels"]["team"] == "a"


def test_pod_keeps_volumes_and_sidecars_and_no_shm_when_size_is_zero():
    spec = _decode_pod()["spec"]
    assert [c["name"] for c in spec["containers"]] == ["main", "sidecar"]
    assert [v["name"] for v in spec["volumes"]] == ["models"]
    main = spec["containers"][0]
    assert [m["name"] for m in main["volumeMounts"]] == ["models"]
