"""The DynamoGraphDeployment models: manifests written for NVIDIA Dynamo parse, unknown pod-spec
fields are kept, schema rules (enums, minimums, defaults) hold, and dumping gives the k8s spelling."""

from __future__ import annotations

import pytest
import yaml
from dynamo_api.models import DynamoGraphDeployment, GraphStatus
from pydantic import ValidationError

# A manifest in the shape of NVIDIA Dynamo's SGLang examples, using fields we accept but ignore too.
DYNAMO_MANIFEST = """
apiVersion: nvidia.com/v1alpha1
kind: DynamoGraphDeployment
metadata:
  name: sglang-disagg
  namespace: team-a
  uid: 0b6c-uid
  generation: 3
spec:
  backendFramework: sglang
  envs:
    - name: HF_TOKEN
      valueFrom:
        secretKeyRef: {name: hf-token-secret, key: HF_TOKEN}
    - name: GLOO_SOCKET_IFNAME
      value: eth0
  pvcs:
    - name: model-cache
      create: true
      size: 100Gi
      storageClass: fast
      volumeAccessMode: ReadWriteMany
  services:
    Frontend:
      dynamoNamespace: sglang-disagg
      componentType: frontend
      replicas: 1
      extraPodSpec:
        mainContainer:
          image: nvcr.io/nvidia/ai-dynamo/sglang-runtime:0.6.1
    Planner:
      componentType: planner
      extraPodSpec:
        mainContainer:
          command: [python3, -m, dynamo.planner]
    prefill:
      envFromSecret: hf-token-secret
      componentType: worker
      subComponentType: prefill
      replicas: 2
      multinode:
        nodeCount: 2
      resources:
        requests:
          cpu: "10"
          memory: 20Gi
          custom:
            ephemeral-storage: 2Gi
        limits:
          gpu: 4
      volumeMounts:
        - name: model-cache
          mountPoint: /models
      sharedMemory:
        size: 16Gi
      autoscaling: {enabled: false, minReplicas: 1, maxReplicas: 3, metrics: [{type: Resource}]}
      ingress: {enabled: false, host: example.com}
      livenessProbe:
        httpGet: {path: /live, port: 9090}
        periodSeconds: 5
      extraPodMetadata:
        labels: {team: a}
      extraPodSpec:
        tolerations:
          - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
        nodeSelector: {gpu: h100}
        mainContainer:
          image: nvcr.io/nvidia/ai-dynamo/sglang-runtime:0.6.1
          workingDir: /workspace/examples/backends/sglang
          command: [python3, -m, dynamo.sglang]
          args: [--tp, "8", --disaggregation-mode, prefill]
          securityContext: {privileged: false}
"""


def test_dynamo_manifest_parses_with_every_field():
    dgd = DynamoGraphDeployment.model_validate(yaml.safe_load(DYNAMO_MANIFEST))
    assert dgd.name == "sglang-disagg"
    assert dgd.namespace == "team-a"
    assert dgd.dynamo_namespace == "team-a-sglang-disagg"
    assert dgd.metadata["uid"] == "0b6c-uid"
    assert dgd.metadata.get("generation") == 3
    assert dgd.spec.backend_framework == "sglang"
    prefill = dgd.spec.services["prefill"]
    assert prefill.node_count == 2
    assert prefill.resources.limits.gpu == "4", "YAML integers become quantity strings"
    assert prefill.resources.requests.custom == {"ephemeral-storage": "2Gi"}
    assert prefill.volume_mounts[0].mount_point == "/models"
    assert dgd.spec.envs[0].value_from.secret_key_ref.key == "HF_TOKEN"
    assert dgd.spec.services["Frontend"].dynamo_namespace == "sglang-disagg"
    assert dgd.spec.services["Planner"].component_type == "planner"


def test_unknown_fields_under_extra_pod_spec_are_kept():
    dgd = DynamoGraphDeployment.model_validate(yaml.safe_load(DYNAMO_MANIFEST))
    extra = dgd.spec.services["prefill"].extra_pod_spec.model_dump(by_alias=True, exclude_none=True)
    assert extra == {
        "mainContainer": {
            "image": "nvcr.io/nvidia/ai-dynamo/sglang-runtime:0.6.1",
            "command": ["python3", "-m", "dynamo.sglang"],
            "args": ["--tp", "8", "--disaggregation-mode", "prefill"],
            "workingDir": "/workspace/examples/backends/sglang",
            "securityContext": {"privileged": False},
        },
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"gpu": "h100"},
    }


def test_defaults():
    dgd = DynamoGraphDeployment.model_validate(
        {"metadata": {"name": "g"}, "spec": {"services": {"w": {"componentType": "worker", "multinode": {}}}}}
    )
    service = dgd.spec.services["w"]
    assert dgd.namespace == "default"
    assert service.replicas == 1
    assert service.multinode.node_count == 2
    assert service.envs == [] and service.labels == {}


@pytest.mark.parametrize(
    ("service", "where"),
    [
        ({"componentType": "router"}, "componentType"),
        ({"componentType": "worker", "subComponentType": "both"}, "subComponentType"),
        ({"componentType": "worker", "replicas": -1}, "replicas"),
        ({"componentType": "worker", "multinode": {"nodeCount": 1}}, "nodeCount"),
        ({"componentType": "worker", "resources": {"limits": {"gpu": True}}}, "gpu"),
    ],
)
def test_schema_rules_reject(service, where):
    with pytest.raises(ValidationError) as info:
        DynamoGraphDeployment.model_validate(
            {"metadata": {"name": "g"}, "spec": {"services": {"s": service}}}
        )
    assert where in str(info.value)


def test_backend_framework_enum():
    with pytest.raises(ValidationError):
        DynamoGraphDeployment.model_validate(
            {"metadata": {"name": "g"}, "spec": {"backendFramework": "onnx"}}
        )
    dgd = DynamoGraphDeployment.model_validate(
        {"metadata": {"name": "g"}, "spec": {"backendFramework": "vllm"}}
    )
    assert dgd.spec.backend_framework == "vllm", "other Dynamo backends parse; render answers them"


def test_dump_gives_kubernetes_spelling():
    dgd = DynamoGraphDeployment.model_validate(yaml.safe_load(DYNAMO_MANIFEST))
    dumped = dgd.model_dump(by_alias=True, exclude_none=True)
    prefill = dumped["spec"]["services"]["prefill"]
    assert prefill["subComponentType"] == "prefill"
    assert prefill["envFromSecret"] == "hf-token-secret"
    assert prefill["multinode"] == {"nodeCount": 2}
    assert DynamoGraphDeployment.model_validate(dumped) == dgd


def test_status_model():
    status = GraphStatus.model_validate(
        {
            "state": "successful",
            "observedGeneration": 3,
            "groupBackend": "statefulset",
            "conditions": [{"type": "Ready", "status": "True", "reason": "AllReady", "message": "ok"}],
            "services": {"decode": {"componentKind": "StatefulSet", "replicas": 2, "readyReplicas": 1}},
        }
    )
    assert status.conditions[0].reason == "AllReady"
    assert status.services["decode"].ready_replicas == 1
    with pytest.raises(ValidationError):
        GraphStatus.model_validate({"conditions": [{"type": "Ready", "status": "Maybe"}]})
