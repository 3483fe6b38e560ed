"""Per-service scaling from outside, against the real apiserver + controller-manager (its HPA controller
included) + kwok: a service with scalingAdapter gets a DynamoGraphDeploymentScalingAdapter owned by the
graph; `kubectl scale` on it (a PATCH of its /scale subresource) and an autoscaling/v2 HPA aimed at it
change the service's Deployment; the /scale subresource reports the service's pods and selector;
turning scalingAdapter off deletes the adapter and leaves the replicas; a planner scaling the same
service wins, and the graph says so in a ScalingConflict condition and an Event; an adapter name held
by another object, or no adapter CRD on the API server, is a warning on the graph, said once."""

from __future__ import annotations

import json

import pytest

from tests.integration.operator.conftest import (
    ADAPTER_CRD,
    REPO,
    Kubectl,
    OperatorProcess,
    example,
    wait_until,
)

pytestmark = pytest.mark.integration

ADAPTER = "dgdsa"
ADAPTER_KIND = "DynamoGraphDeploymentScalingAdapter"
GRAPH_LABEL = "nvidia.com/dynamo-graph-deployment-name"


def _opt_in(manifest: str, service: str) -> dict:
    dgd = example(manifest)
    dgd["spec"]["services"][service]["scalingAdapter"] = {"enabled": True}
    return dgd


def _deployment_replicas(kc: Kubectl, name: str, n: int) -> bool:
    dep = kc.get("deployment", name) or {}
    return dep.get("spec", {}).get("replicas") == n and dep.get("status", {}).get("readyReplicas") == n


def _hpa(target: str, replicas: int) -> dict:
    """An HPA whose bounds pin the target (the HPA controller enforces minReplicas without metrics)."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": f"{target}-hpa"},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "nvidia.com/v1alpha1",
                "kind": "DynamoGraphDeploymentScalingAdapter",
                "name": target,
            },
            "minReplicas": replicas,
            "maxReplicas": replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}},
                }
            ],
        },
    }


def test_kubectl_scale_and_an_hpa_scale_one_service_through_its_adapter(
    kc: Kubectl, operator: OperatorProcess
):
    kc.apply(_opt_in("agg.yaml", "decode"))
    graph = kc.wait_ready("sglang-agg")
    adapter = wait_until(lambda: kc.get(ADAPTER, "sglang-agg-decode"), "the decode service's adapter")
    assert adapter["spec"] == {"replicas": 1, "dgdRef": {"name": "sglang-agg", "serviceName": "decode"}}
    (ref,) = adapter["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["uid"], ref["controller"]) == (
        "DynamoGraphDeployment",
        graph["metadata"]["uid"],
        True,
    )
    assert kc.get(ADAPTER, "sglang-agg-frontend") is None  # only the service that opts in
    header, row = kc.run("get", ADAPTER, "sglang-agg-decode").splitlines()[:2]
    assert header.split()[:4] == ["NAME", "DGD", "SERVICE", "REPLICAS"]
    assert row.split()[:3] == ["sglang-agg-decode", "sglang-agg", "decode"]
    selector = f"nvidia.com/dynamo-component=decode,{GRAPH_LABEL}=sglang-agg"
    wait_until(
        lambda: (kc.get(ADAPTER, "sglang-agg-decode") or {}).get("status", {}).get("selector") == selector,
        "the adapter's status to carry the pods' selector",
    )

    kc.run("scale", ADAPTER, "sglang-agg-decode", "--replicas=2")  # PATCH .../sglang-agg-decode/scale
    wait_until(
        lambda: _deployment_replicas(kc, "sglang-agg-decode", 2), "decode's Deployment at 2 ready pods"
    )
    path = f"/apis/nvidia.com/v1alpha1/namespaces/{kc.namespace}/dynamographdeploymentscalingadapters"
    scale = wait_until(
        lambda: (
            (s := json.loads(kc.run("get", "--raw", f"{path}/sglang-agg-decode/scale")))["status"].get(
                "replicas"
            )
            == 2
            and s
        ),
        "the /scale subresource to report 2 replicas",
    )
    assert scale["spec"]["replicas"] == 2 and scale["status"]["selector"] == selector
    dgd = kc.get("dgd", "sglang-agg")
    assert dgd["spec"]["services"]["decode"]["replicas"] == 2
    assert dgd["spec"]["services"]["Frontend"].get("replicas", 1) == 1  # the other service untouched
    beta = json.loads(
        kc.run(
            "get",
            "dynamographdeployments.v1beta1.nvidia.com",
            "sglang-agg",
            "-o",
            "json",
            "--show-managed-fields",
        )
    )
    assert "dynamo-scaling-adapter" in {f["manager"] for f in beta["metadata"]["managedFields"]}
    assert [e["message"] for e in kc.events("sglang-agg", "Scaled")] == [
        "Scaled service decode from 1 to 2 replicas, "
        "as DynamoGraphDeploymentScalingAdapter sglang-agg-decode asks"
    ]

    # the adapter owns the number: an edit of the graph's replicas is set back to the adapter's
    kc.patch("dgd", "sglang-agg", {"spec": {"services": {"decode": {"replicas": 4}}}})
    wait_until(
        lambda: (kc.get("dgd", "sglang-agg") or {})["spec"]["services"]["decode"]["replicas"] == 2,
        "the graph's decode replicas set back to the adapter's 2",
    )
    assert kc.get(ADAPTER, "sglang-agg-decode")["spec"]["replicas"] == 2

    kc.apply(_hpa("sglang-agg-decode", 3))  # the real HPA controller scales the adapter
    wait_until(lambda: _deployment_replicas(kc, "sglang-agg-decode", 3), "decode at 3 ready pods (HPA)", 90)
    kc.delete("hpa", "sglang-agg-decode-hpa")

    kc.patch("dgd", "sglang-agg", {"spec": {"services": {"decode": {"scalingAdapter": None}}}})
    wait_until(lambda: kc.get(ADAPTER, "sglang-agg-decode") is None, "the adapter to be deleted")
    kc.wait_ready("sglang-agg")
    assert kc.get("deployment", "sglang-agg-decode")["spec"]["replicas"] == 3  # the replicas stay
    assert kc.events("sglang-agg", "Deleted")


def test_planner_and_adapter_on_one_service_is_refused_with_a_condition(
    kc: Kubectl, operator: OperatorProcess
):
    kc.apply(_opt_in("disagg-planner.yaml", "decode"))
    kc.apply(_hpa("sglang-disagg-planner-decode", 2))  # aimed at the adapter the conflict withholds
    cond = wait_until(
        lambda: kc.condition("sglang-disagg-planner", "ScalingConflict"), "the ScalingConflict condition"
    )
    assert (cond["status"], cond["reason"]) == ("True", "PlannerScalesService")
    assert "service decode sets scalingAdapter but planner Planner scales it" in cond["message"]
    assert "remove scalingAdapter from the service" in cond["message"]
    (event,) = wait_until(
        lambda: kc.events("sglang-disagg-planner", "PlannerScalesService"), "the Warning Event"
    )
    assert event["type"] == "Warning"
    kc.wait_ready("sglang-disagg-planner")
    assert kc.list(ADAPTER) == []  # the planner wins: no adapter, so the HPA scales nothing
    assert kc.get("deployment", "sglang-disagg-planner-decode")["spec"]["replicas"] == 1

    kc.patch("dgd", "sglang-disagg-planner", {"spec": {"services": {"decode": {"scalingAdapter": None}}}})
    wait_until(
        lambda: kc.condition("sglang-disagg-planner", "ScalingConflict") is None,
        "the condition to go once nothing opts in",
    )


def _spec_warnings(kc: Kubectl) -> str | None:
    return (kc.condition("sglang-agg", "SpecWarnings") or {}).get("status")


def _serve_with_adapter_warning(kc: Kubectl, operator_factory) -> dict:
    """agg.yaml with an adapter on decode, served by an operator that visits every 2 s: the graph gets
    Ready; returns its SpecWarnings condition once it is True."""
    operator_factory("--resync-interval-s", "2")
    kc.apply(_opt_in("agg.yaml", "decode"))
    kc.wait_ready("sglang-agg")
    wait_until(lambda: _spec_warnings(kc) == "True", "the SpecWarnings condition")
    return kc.condition("sglang-agg", "SpecWarnings")


def test_an_adapter_name_taken_by_another_object_is_a_warning_once_and_the_graph_runs(
    kc: Kubectl, operator_factory
):
    """The name the graph's adapter needs is held by an adapter that is not the graph's: the graph still
    becomes Ready, its SpecWarnings condition and one Warning Event name the adapter and the fix, and once
    that object is deleted the operator creates the graph's own and the warning clears."""
    kc.apply(
        {
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": ADAPTER_KIND,
            "metadata": {"name": "sglang-agg-decode"},
            "spec": {"replicas": 1, "dgdRef": {"name": "another-graph", "serviceName": "decode"}},
        }
    )
    cond = _serve_with_adapter_warning(kc, operator_factory)
    assert cond["reason"] == "ScalingAdapterNameTaken"
    assert f"a {ADAPTER_KIND} named sglang-agg-decode exists and is not this graph's" in cond["message"]
    assert "kubectl delete dgdsa sglang-agg-decode" in cond["message"]
    # the visits that took the graph from pending to Ready met the taken name again: one Event still
    (event,) = kc.events("sglang-agg", "ScalingAdapterNameTaken")
    assert event["type"] == "Warning"

    kc.delete(ADAPTER, "sglang-agg-decode")
    adapter = wait_until(
        lambda: (
            (a := kc.get(ADAPTER, "sglang-agg-decode")) and a["spec"]["dgdRef"]["name"] == "sglang-agg" and a
        ),
        "the graph's own adapter",
    )
    assert adapter["metadata"]["ownerReferences"][0]["name"] == "sglang-agg"
    wait_until(lambda: _spec_warnings(kc) == "False", "the warning to clear")


def test_without_the_adapter_crd_the_graph_runs_says_so_once_and_recovers_when_it_is_applied(
    kc: Kubectl, kube_cluster, operator_factory
):
    """No adapter CRD on the API server: the graph is Ready with its spec's replicas and a SpecWarnings
    condition naming the CRD and how to apply it; applying the CRD creates the adapter and clears it."""
    crd_file = next((REPO / "crds").glob("*scalingadapter*"))
    kube_cluster.kubectl("delete", "crd", ADAPTER_CRD, "--timeout=60s")
    try:
        cond = _serve_with_adapter_warning(kc, operator_factory)
        assert cond["reason"] == "ScalingAdapterCRDMissing"
        assert (
            f"the API server has no {ADAPTER_KIND} CRD; apply charts/dynamo-operator/crds/" in cond["message"]
        )
        assert [e["type"] for e in kc.events("sglang-agg", "ScalingAdapterCRDMissing")] == ["Warning"]
    finally:
        kube_cluster.kubectl("apply", "--server-side", "-f", str(crd_file))
        kube_cluster.kubectl("wait", "--for=condition=Established", f"crd/{ADAPTER_CRD}", "--timeout=60s")
    wait_until(lambda: kc.get(ADAPTER, "sglang-agg-decode"), "the adapter, once its CRD is there")
    wait_until(lambda: _spec_warnings(kc) == "False", "the warning to clear")
