"""A graph with an endpoint picker (examples/gateway.yaml) on the real apiserver: without GAIE's CRD it
reaches Ready with the picker and its Services and says once, in SpecWarnings and a Warning Event, that
the InferencePool needs the CRD; with the vendored CRD installed the next visit creates the pool, which
the API server accepts against GAIE's own schema; removing the picker prunes it all."""

from __future__ import annotations

import pytest

from tests.integration.operator.conftest import REPO, Kubectl, OperatorProcess, example, wait_until
from tests.support.cluster import LocalCluster

pytestmark = pytest.mark.integration

POOL_CRD = REPO / "charts/dynamo-operator/files/inference.networking.k8s.io_inferencepools.yaml"
POOL_CRD_NAME = "inferencepools.inference.networking.k8s.io"
GRAPH = "sglang-gateway"


def _install_pool_crd(cluster: LocalCluster) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(POOL_CRD))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{POOL_CRD_NAME}", "--timeout=60s")


def test_picker_graph_without_then_with_the_inference_pool_crd(
    kc: Kubectl, operator: OperatorProcess, kube_cluster: LocalCluster
):
    kube_cluster.kubectl("delete", "crd", POOL_CRD_NAME, "--ignore-not-found", "--timeout=60s")
    kc.apply(example("gateway.yaml"))
    kc.wait_ready(GRAPH)
    assert kc.get("deployment", f"{GRAPH}-epp") and kc.get("service", f"{GRAPH}-epp")
    assert kc.get("service", f"{GRAPH}-frontend-pods")["spec"]["clusterIP"] == "None"
    warnings = kc.condition(GRAPH, "SpecWarnings")
    assert (warnings["status"], warnings["reason"]) == ("True", "InferencePoolCrdMissing")
    assert "inferenceExtension.installCRD=true" in warnings["message"]
    (event,) = kc.events(GRAPH, "InferencePoolCrdMissing")
    assert event["type"] == "Warning"

    try:
        _install_pool_crd(kube_cluster)
        kc.run("annotate", "dgd", GRAPH, "example.com/poke=1")  # any change: the graph is visited again
        pool = wait_until(lambda: kc.get("inferencepool", f"{GRAPH}-pool"), "the InferencePool")
        assert pool["spec"]["endpointPickerRef"] == {
            "group": "",  # GAIE's defaults, filled in by the API server from its schema
            "kind": "Service",
            "name": f"{GRAPH}-epp",
            "port": {"number": 9002},
            "failureMode": "FailClose",
        }
        assert pool["spec"]["targetPorts"] == [{"number": 8000}]
        (owner,) = pool["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("DynamoGraphDeployment", GRAPH)
        wait_until(
            lambda: kc.condition(GRAPH, "SpecWarnings")["status"] == "False", "the warning to be cleared"
        )
        assert len(kc.events(GRAPH, "InferencePoolCrdMissing")) == 1  # said once

        kc.patch("dgd", GRAPH, [{"op": "remove", "path": "/spec/services/epp"}], type_="json")
        wait_until(lambda: not kc.get("inferencepool", f"{GRAPH}-pool"), "the InferencePool to be pruned")
        wait_until(lambda: not kc.get("service", f"{GRAPH}-epp"), "the picker's Service to be pruned")
        assert not kc.get("deployment", f"{GRAPH}-epp")
        assert not kc.get("service", f"{GRAPH}-frontend-pods")
        frontend = kc.get("deployment", f"{GRAPH}-frontend")
        assert "direct" not in (frontend["spec"]["template"]["spec"]["containers"][0].get("args") or [])
    finally:
        kube_cluster.kubectl(
            "delete", "crd", POOL_CRD_NAME, "--ignore-not-found", "--timeout=60s", check=False
        )
