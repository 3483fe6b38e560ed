"""Manifests written for NVIDIA Dynamo's operator (capitalised service names, `python3 -m dynamo.sglang`,
roles given only by --disaggregation-mode, a planner, sh -c commands) are accepted and get the same
topology and flags, keeping their module unless the worker-module annotation asks for ours."""

from __future__ import annotations

import yaml
from dynamo_api.models import DynamoGraphDeployment
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render

# The shape of Dynamo's SGLang disagg-multinode example (written here, not copied).
DYNAMO_DISAGG_MULTINODE = """
apiVersion: nvidia.com/v1alpha1
kind: DynamoGraphDeployment
metadata: {name: sglang-disagg-multinode, namespace: prod, uid: abc}
spec:
  backendFramework: sglang
  envs:
    - name: HF_TOKEN
      valueFrom: {secretKeyRef: {name: hf-token-secret, key: HF_TOKEN}}
    - {name: GLOO_SOCKET_IFNAME, value: eth0}
  services:
    Frontend:
      dynamoNamespace: sglang-disagg-multinode
      componentType: frontend
      replicas: 1
      extraPodSpec:
        mainContainer: {image: nvcr.io/nvidia/ai-dynamo/sglang-runtime:0.6.1}
    decode:
      multinode: {nodeCount: 2}
      envFromSecret: hf-token-secret
      componentType: worker
      replicas: 1
      resources: {limits: {gpu: "4"}}
      extraPodSpec:
        mainContainer:
          image: nvcr.io/nvidia/ai-dynamo/sglang-runtime:0.6.1
          workingDir: /workspace/components/backends/sglang
          command: [python3, -m, dynamo.sglang]
          args: [--model-path, Qwen/Qwen3-0.6B, --served-model-name, Qwen/Qwen3-0.6B, --tp-size, "8",
                 --trust-remote-code, --skip-tokenizer-init, --disaggregation-mode, decode,
                 --disaggregation-transfer-backend, nixl, --disaggregation-bootstrap-port, "30001",
                 --host, 0.0.0.0, --mem-fraction-static, "0.82"]
    prefill:
      multinode: {nodeCount: 2}
      envFromSecret: hf-token-secret
      componentType: worker
      replicas: 1
      resources: {limits: {gpu: "4"}}
      extraPodSpec:
        mainContainer:
          image: nvcr.io/nvidia/ai-dynamo/sglang-runtime:0.6.1
          command: [sh, -c]
          args: ["python3 -m dynamo.sglang --model-path Qwen/Qwen3-0.6B --tp-size 8
                  --disaggregation-mode prefill --disaggregation-transfer-backend nixl
                  --disaggregation-bootstrap-port 30001 --host 0.0.0.0"]
    Planner:
      componentType: planner
      replicas: 1
      extraPodSpec:
        mainContainer:
          image: nvcr.io/nvidia/ai-dynamo/dynamo-planner:0.6.1
          command: [python3, -m, dynamo.planner]
          args: [--config, '{"backend": "sglang"}']
"""


def _dgd(annotations: dict | None = None) -> DynamoGraphDeployment:
    body = yaml.safe_load(DYNAMO_DISAGG_MULTINODE)
    body["metadata"]["annotations"] = annotations or {}
    return DynamoGraphDeployment.model_validate(body)


def _leaders(rendered, service: str) -> dict:
    return next(
        o
        for o in rendered.objects
        if o["kind"] == "StatefulSet" and o["metadata"]["name"] == f"sglang-disagg-multinode-{service}-0"
    )["spec"]["template"]["spec"]["containers"][0]


def test_same_topology_and_flags():
    rendered = render(_dgd(), OperatorConfig(group_backend="statefulset"))
    assert rendered.problems == ()
    assert {(n.reason, n.service) for n in rendered.notices} == {
        ("IgnoredFields", "Frontend"),
        ("RunAsGiven", "Planner"),
        ("TcpTransport", None),
    }
    plans = rendered.services
    assert {name: (p.kind, p.role, p.replicas, p.nodes_per_replica) for name, p in plans.items()} == {
        "Frontend": ("Deployment", None, 1, 1),
        "Planner": ("Deployment", None, 1, 1),
        "decode": ("StatefulSet", "decode", 1, 2),
        "prefill": ("StatefulSet", "prefill", 1, 2),
    }
    host = "sglang-disagg-multinode-decode-0-0.sglang-disagg-multinode-decode-0.prod.svc"
    decode = _leaders(rendered, "decode")
    assert decode["image"] == "nvcr.io/nvidia/ai-dynamo/sglang-runtime:0.6.1"
    assert decode["command"] == ["python3", "-m", "dynamo.sglang"], "the module is kept"
    assert decode["args"][-6:] == ["--dist-init-addr", f"{host}:29500", "--nnodes", "2", "--node-rank", "0"]
    assert decode["envFrom"] == [{"secretRef": {"name": "hf-token-secret"}}]
    prefill = _leaders(rendered, "prefill")
    assert prefill["command"] == ["sh", "-c"]
    assert prefill["args"][0].endswith(
        "--disaggregation-bootstrap-port 30001 --host 0.0.0.0 --dist-init-addr "
        "sglang-disagg-multinode-prefill-0-0.sglang-disagg-multinode-prefill-0.prod.svc:29500 "
        "--nnodes 2 --node-rank 0"
    )
    ports = {port["name"]: port for port in prefill["ports"]}
    assert ports["bootstrap"] == {"name": "bootstrap", "containerPort": 30001, "protocol": "TCP"}
    assert ports["dist-init"] == {"name": "dist-init", "containerPort": 29500, "protocol": "TCP"}  # leader's
    frontend = next(
        o for o in rendered.objects if o["metadata"]["name"] == "sglang-disagg-multinode-frontend"
    )
    assert frontend["kind"] == "Service"


def test_worker_module_annotation_swaps_modules():
    rendered = render(
        _dgd({"nvidia.com/dynamo-worker-module": "dynamo_worker.sglang"}), OperatorConfig(group_backend="lws")
    )
    assert rendered.problems == ()
    lws = next(o for o in rendered.objects if o["metadata"]["name"] == "sglang-disagg-multinode-prefill-0")
    template = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    script = template["spec"]["containers"][0]["args"][0]
    assert script.startswith("python3 -m dynamo_worker.sglang --model-path")
    assert script.endswith("--nnodes 2 --node-rank '$(DYN_NODE_RANK)'")
    planner = next(
        o
        for o in rendered.objects
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "sglang-disagg-multinode-planner"
    )
    assert planner["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "python3",
        "-m",
        "dynamo.planner",
    ]
    swapped = [n.service for n in rendered.notices if n.reason == "ModuleSwapped"]
    assert swapped == ["decode", "prefill"], "the frontend sets no command: it runs ours already"


def test_dynamo_module_in_our_image_is_kept_without_warning():
    """Dropping Dynamo's image but keeping `-m dynamo.sglang` works: our runtime image provides the
    `dynamo.sglang`/`dynamo.frontend` modules (dynamo_worker.aliases), so the command is kept as written
    and nothing is warned about."""
    body = yaml.safe_load(DYNAMO_DISAGG_MULTINODE)
    for service in body["spec"]["services"].values():
        ((service.get("extraPodSpec") or {}).get("mainContainer") or {}).pop("image", None)
    rendered = render(DynamoGraphDeployment.model_validate(body), OperatorConfig())
    assert rendered.problems == ()
    assert [n for n in rendered.notices if n.warning and n.reason != "HostOverridden"] == []
    decode = _leaders(rendered, "decode")
    assert decode["image"] == OperatorConfig().worker_image
    assert decode["command"] == ["python3", "-m", "dynamo.sglang"], "the image maps Dynamo's module"
