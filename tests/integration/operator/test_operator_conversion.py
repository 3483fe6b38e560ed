"""Both API versions on the real apiserver, converted by the operator's webhook (HTTPS, registered in the
CRD by the operator itself with a 127.0.0.1 URL and its generated CA): a graph written in v1beta1 reads
back as v1alpha1 and the other way round, an edit in one version shows in the other, status is the same
in both; our v1beta1 examples and NVIDIA Dynamo's v1beta1 SGLang examples (images changed to ours) reach
Ready and read back as v1alpha1; and while the operator is down, v1alpha1 requests fail with the
webhook's name while v1beta1 keeps working (what docs/kubernetes.md, "Two API versions, one
conversion webhook", tells users)."""

from __future__ import annotations

import base64
import copy
import json
import ssl
import urllib.request
from pathlib import Path

import pytest
import yaml
from dynamo_api import models

from tests.integration.operator.conftest import DGD_CRD, EXAMPLES, Kubectl, OperatorProcess, example
from tests.support.cluster import ClusterError
from tests.support.dynamo_examples import serving

pytestmark = pytest.mark.integration

DGD_V1BETA1 = "dynamographdeployments.v1beta1.nvidia.com"


def at_v1beta1(kc: Kubectl) -> Kubectl:
    return Kubectl(kc.cluster, kc.namespace, dgd_resource=DGD_V1BETA1)


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _services(obj: dict) -> dict:
    """spec.services with the schema's defaults filled, as the API server returns them."""
    spec = models.GraphSpec.model_validate(obj["spec"])
    return spec.model_dump(by_alias=True, exclude_none=True, mode="json")["services"]


def test_operator_registers_its_webhook_in_the_crd(kc: Kubectl, operator: OperatorProcess):
    crd = json.loads(kc.cluster.kubectl("get", "crd", DGD_CRD, "-o", "json"))
    webhook = crd["spec"]["conversion"]["webhook"]
    url = f"https://127.0.0.1:{operator.webhook_port}/convert"
    assert webhook["clientConfig"]["url"] == url and "service" not in webhook["clientConfig"]
    # The CA written into the CRD is the one that signed what the webhook serves.
    ctx = ssl.create_default_context(cadata=base64.b64decode(webhook["clientConfig"]["caBundle"]).decode())
    review = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "request": {"uid": "x"}}
    request = urllib.request.Request(url, json.dumps(review).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=ctx, timeout=10) as resp:
        assert json.load(resp)["response"]["uid"] == "x"


def test_v1beta1_graph_reads_back_as_v1alpha1_and_the_other_way(kc: Kubectl, operator: OperatorProcess):
    beta_kc = at_v1beta1(kc)
    beta_kc.apply(load(EXAMPLES / "v1beta1" / "disagg.yaml"))
    as_alpha = kc.get("dgd", "sglang-disagg")
    assert as_alpha["apiVersion"] == "nvidia.com/v1alpha1"
    assert _services(as_alpha) == _services(example("disagg.yaml"))

    kc.apply(example("agg.yaml"))
    as_beta = beta_kc.get("dgd", "sglang-agg")
    assert as_beta["apiVersion"] == "nvidia.com/v1beta1"
    assert as_beta["spec"]["components"] == load(EXAMPLES / "v1beta1" / "agg.yaml")["spec"]["components"]

    # an edit at v1alpha1 shows at v1beta1, and the other way round
    kc.patch("dgd", "sglang-disagg", {"spec": {"services": {"decode": {"replicas": 2}}}})
    comps = {c["name"]: c for c in beta_kc.get("dgd", "sglang-disagg")["spec"]["components"]}
    assert comps["decode"]["replicas"] == 2
    beta = beta_kc.get("dgd", "sglang-disagg")
    prefill = next(c for c in beta["spec"]["components"] if c["name"] == "prefill")
    prefill["replicas"] = 3
    meta = {"name": "sglang-disagg"}
    beta_kc.apply(
        {"apiVersion": beta["apiVersion"], "kind": beta["kind"], "metadata": meta, "spec": beta["spec"]}
    )
    assert kc.get("dgd", "sglang-disagg")["spec"]["services"]["prefill"]["replicas"] == 3

    # one status, whichever version is read
    kc.wait_ready("sglang-disagg", timeout=90)
    alpha_status, beta_status = (
        kc.get("dgd", "sglang-disagg")["status"],
        beta_kc.get("dgd", "sglang-disagg")["status"],
    )
    assert alpha_status == beta_status
    assert alpha_status["services"]["decode"]["readyReplicas"] == 2


def test_fields_only_one_version_has_survive_an_edit_in_the_other(kc: Kubectl, operator: OperatorProcess):
    beta_kc = at_v1beta1(kc)
    graph = load(EXAMPLES / "v1beta1" / "agg.yaml")
    decode = graph["spec"]["components"][1]
    decode["minAvailable"] = 1
    decode["topologyConstraint"] = {"packDomain": "rack"}
    graph["spec"]["priorityClassName"] = "high"
    beta_kc.apply(graph)
    kc.patch("dgd", "sglang-agg", {"spec": {"services": {"decode": {"replicas": 2}}}})
    back = beta_kc.get("dgd", "sglang-agg")
    decode = next(c for c in back["spec"]["components"] if c["name"] == "decode")
    assert (decode["replicas"], decode["minAvailable"], decode["topologyConstraint"]) == (
        2,
        1,
        {"packDomain": "rack"},
    )
    assert back["spec"]["priorityClassName"] == "high"


@pytest.mark.parametrize("manifest", sorted(p.name for p in (EXAMPLES / "v1beta1").glob("*.yaml")))
def test_v1beta1_example_reaches_ready(kc: Kubectl, operator: OperatorProcess, manifest: str):
    graph = load(EXAMPLES / "v1beta1" / manifest)
    at_v1beta1(kc).apply(graph)
    obj = at_v1beta1(kc).wait_ready(graph["metadata"]["name"], timeout=90)
    assert obj["status"]["state"] == "successful"
    assert sorted(obj["status"]["services"]) == sorted(c["name"] for c in graph["spec"]["components"])


@pytest.mark.parametrize("path", serving("v1beta1/"), ids=lambda p: p.name)
def test_dynamo_v1beta1_example_reaches_ready_and_reads_back_as_v1alpha1(
    kc: Kubectl, operator: OperatorProcess, path: Path
):
    graph = load(path)
    name = graph["metadata"]["name"]
    kc.cluster.kubectl("apply", "-n", kc.namespace, "-f", str(path))  # the file as a user applies it
    at_v1beta1(kc).wait_ready(name, timeout=90)
    alpha = kc.get("dgd", name)
    assert alpha["apiVersion"] == "nvidia.com/v1alpha1"
    assert alpha["status"]["state"] == "successful"
    services = alpha["spec"]["services"]
    assert list(services) == sorted(c["name"] for c in graph["spec"]["components"])
    for comp in graph["spec"]["components"]:
        svc = services[comp["name"]]
        if comp["type"] in ("prefill", "decode"):
            assert (svc["componentType"], svc["subComponentType"]) == ("worker", comp["type"])
        else:
            assert svc["componentType"] == comp["type"]
        main = comp["podTemplate"]["spec"]["containers"][0]
        assert svc["extraPodSpec"]["mainContainer"]["image"] == main["image"]
        gpus = main.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        if gpus:
            assert svc["resources"]["limits"]["gpu"] == gpus


def test_while_the_operator_is_down_v1alpha1_fails_and_v1beta1_works(kc: Kubectl, operator: OperatorProcess):
    beta_kc = at_v1beta1(kc)
    beta_kc.apply(load(EXAMPLES / "v1beta1" / "agg.yaml"))
    kc.wait_ready("sglang-agg", timeout=90)
    operator.stop()

    with pytest.raises(ClusterError, match="conversion webhook"):  # the API server names what failed
        kc.get("dgd", "sglang-agg")
    # v1beta1 (the stored version, and what plain `kubectl get dgd` asks for) keeps working: read,
    # edit, scale, delete.
    assert (
        json.loads(kc.cluster.kubectl("get", "dgd", "sglang-agg", "-n", kc.namespace, "-o", "json"))[
            "apiVersion"
        ]
        == "nvidia.com/v1beta1"
    )
    graph = copy.deepcopy(load(EXAMPLES / "v1beta1" / "agg.yaml"))
    graph["spec"]["components"][1]["replicas"] = 2
    beta_kc.apply(graph)

    operator.start()  # back: v1alpha1 works again (the operator re-registers its new certificate)
    assert kc.get("dgd", "sglang-agg")["spec"]["services"]["decode"]["replicas"] == 2
