"""``helm install charts/dynamo-operator`` on a real node, with the operator image built here: the operator
pod becomes Ready under the kubelet's probes, and the API server reaches its webhooks through their
Service with the certificate the operator made: a v1beta1 graph is stored and read back as v1alpha1
(conversion), and a graph that cannot run is refused at ``kubectl apply`` (validation).
"""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.real.conftest import REPO, KubectlError, Real
from tests.support import realnode

pytestmark = pytest.mark.timeout(600)


def test_the_operator_pod_is_ready_under_the_kubelet(real: Real, operator: dict[str, float]) -> None:
    pods = real.pods(realnode.RELEASE, "app.kubernetes.io/component=operator")
    assert len(pods) == 1
    conditions = {c["type"]: c["status"] for c in pods[0]["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    assert pods[0]["spec"]["containers"][0]["image"] == realnode.OPERATOR_IMAGE
    print({"helm install ready_s": round(operator["ready_s"], 1)})


def test_a_v1beta1_graph_is_read_back_as_v1alpha1_through_the_conversion_webhook(
    real: Real, operator: dict[str, float], namespace: str
) -> None:
    graph = yaml.safe_load((REPO / "examples" / "v1beta1" / "agg.yaml").read_text())
    graph["metadata"]["name"] = "converted"
    for component in graph["spec"]["components"]:
        component["replicas"] = 0  # only the conversion is under test here
    real.apply(namespace, [graph])
    stored = real.json("get", "dynamographdeployments.v1beta1.nvidia.com/converted", "-n", namespace)
    old = real.json("get", "dynamographdeployments.v1alpha1.nvidia.com/converted", "-n", namespace)
    assert stored["apiVersion"] == "nvidia.com/v1beta1" and "components" in stored["spec"]
    assert old["apiVersion"] == "nvidia.com/v1alpha1"
    assert {s["componentType"] for s in old["spec"]["services"].values()} == {
        c["type"] for c in graph["spec"]["components"]
    }


def test_a_graph_that_cannot_run_is_refused_at_kubectl_apply(
    real: Real, operator: dict[str, float], namespace: str
) -> None:
    graph = yaml.safe_load((REPO / "examples" / "disagg.yaml").read_text())
    bad = copy.deepcopy(graph)
    bad["metadata"]["name"] = "too-wide"
    args = bad["spec"]["services"]["decode"]["extraPodSpec"]["mainContainer"]["args"]
    args[args.index("--tp") + 1] = "2"  # two GPUs wide on a pod of one
    with pytest.raises(KubectlError, match=r"(?i)denied the request.*tp"):
        real.apply(namespace, [bad])
    assert "too-wide" not in real.kubectl("get", "dgd", "-n", namespace, "-o", "name")
