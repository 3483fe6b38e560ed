"""v1beta1 fields reach the pods on the real apiserver, without a gang scheduler installed: the graph's
priorityClassName (a real PriorityClass, so the pods get its priority), its labels and annotations on
every pod, minAvailable as a PodDisruptionBudget the eviction API honours; the graph is Ready and its
SpecWarnings condition says that minAvailable cannot start the services as one gang here. The fields
Dynamo's current v1alpha1 has (the graph's labels, annotations, priorityClassName, topologyConstraint;
a service's topologyConstraint, eppConfig, gpuMemoryService) are kept by the API server in both versions
(not pruned) and either placed on the pods or named in SpecWarnings."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator

import pytest

from tests.integration.operator.conftest import Kubectl, OperatorProcess, example, wait_until

DGD_V1BETA1 = "dynamographdeployments.v1beta1.nvidia.com"

pytestmark = pytest.mark.integration

GRAPH = "placed"


@pytest.fixture
def priority_class(kc: Kubectl) -> Iterator[str]:
    name = f"serving-{kc.namespace}"[:63]
    kc.cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": 1000,
            }
        ),
    )
    try:
        yield name
    finally:
        kc.cluster.kubectl("delete", "priorityclass", name, "--ignore-not-found", check=False)


def test_priority_labels_and_budgets_reach_the_pods(
    kc: Kubectl, operator: OperatorProcess, priority_class: str
):
    graph = copy.deepcopy(example("v1beta1/disagg.yaml"))
    graph["metadata"]["name"] = GRAPH
    graph["spec"].update(
        priorityClassName=priority_class, labels={"team": "search"}, annotations={"owner": "search-oncall"}
    )
    decode = next(c for c in graph["spec"]["components"] if c["name"] == "decode")
    decode.update(replicas=2, minAvailable=1)
    kc.run("apply", "-f", "-", input=json.dumps(graph))  # v1beta1, as written
    kc.wait_ready(GRAPH, timeout=90)

    pods = kc.list("pods", f"nvidia.com/dynamo-graph-deployment-name={GRAPH}")
    assert len(pods) == 4  # frontend, prefill, 2 decode
    for pod in pods:
        assert pod["spec"]["priorityClassName"] == priority_class and pod["spec"]["priority"] == 1000
        assert pod["metadata"]["labels"]["team"] == "search"
        assert pod["metadata"]["annotations"]["owner"] == "search-oncall"
    budget = kc.get("poddisruptionbudget", f"{GRAPH}-decode")
    assert budget["spec"]["minAvailable"] == 1
    wait_until(
        lambda: (
            (kc.get("poddisruptionbudget", f"{GRAPH}-decode").get("status") or {}).get("disruptionsAllowed")
            == 1
        ),
        "the budget to allow one decode pod's eviction",
    )
    warnings = kc.condition(GRAPH, "SpecWarnings")
    assert warnings["status"] == "True" and warnings["reason"] == "GangSchedulerMissing"
    assert "decode set minAvailable" in warnings["message"]


def test_dynamo_v1alpha1_fields_are_kept_and_placed_or_named(
    kc: Kubectl, operator: OperatorProcess, priority_class: str
):
    graph = copy.deepcopy(example("disagg.yaml"))  # v1alpha1
    graph["metadata"]["name"] = "alpha-fields"
    shared = {
        "labels": {"team": "search"},
        "annotations": {"owner": "search-oncall"},
        "priorityClassName": priority_class,
        "topologyConstraint": {"topologyProfile": "gb200-nvl72", "packDomain": "host"},
    }
    graph["spec"].update(copy.deepcopy(shared))
    decode_fields = {
        "topologyConstraint": {"packDomain": "host"},
        "eppConfig": {"configMapRef": {"name": "epp", "key": "config.yaml"}},
        "gpuMemoryService": {"enabled": True, "mode": "intraPod"},
    }
    graph["spec"]["services"]["decode"].update(copy.deepcopy(decode_fields))
    kc.apply(graph)
    obj = kc.wait_ready("alpha-fields", timeout=90)

    # kept at v1alpha1 (read through the conversion webhook) and in the stored v1beta1 spec
    assert {k: obj["spec"][k] for k in shared} == shared
    decode = obj["spec"]["services"]["decode"]
    assert {k: decode[k] for k in decode_fields} == decode_fields
    stored = Kubectl(kc.cluster, kc.namespace, dgd_resource=DGD_V1BETA1).get("dgd", "alpha-fields")
    assert {k: stored["spec"][k] for k in shared} == shared
    component = next(c for c in stored["spec"]["components"] if c["name"] == "decode")
    assert component["topologyConstraint"] == decode_fields["topologyConstraint"]
    assert component["eppConfig"] == decode_fields["eppConfig"]
    assert component["experimental"] == {"gpuMemoryService": decode_fields["gpuMemoryService"]}

    # placed: labels and annotations on every object and pod, the priority and the pack domain on pods
    assert kc.get("deployment", "alpha-fields-decode")["metadata"]["labels"]["team"] == "search"
    pods = kc.list("pods", "nvidia.com/dynamo-graph-deployment-name=alpha-fields")
    assert len(pods) == 3
    for pod in pods:
        assert pod["spec"]["priorityClassName"] == priority_class and pod["spec"]["priority"] == 1000
        assert pod["metadata"]["labels"]["team"] == "search"
        assert pod["metadata"]["annotations"]["owner"] == "search-oncall"
        terms = pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert "kubernetes.io/hostname" in [t["topologyKey"] for t in terms]
    assert len({pod["spec"]["nodeName"] for pod in pods}) == 1, "packDomain host: one node"

    # named: what has no counterpart here
    warnings = kc.condition("alpha-fields", "SpecWarnings")
    assert warnings["status"] == "True" and warnings["reason"] == "IgnoredFields"
    for name in ("spec.topologyConstraint.topologyProfile", "eppConfig", "gpuMemoryService"):
        assert name in warnings["message"]
