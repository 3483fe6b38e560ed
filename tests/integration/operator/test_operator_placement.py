"""v1beta1 fields reach the pods on the real apiserver, without a gang scheduler installed: the graph's
priorityClassName (a real PriorityClass, so the pods get its priority), its labels and annotations on
every pod, minAvailable as a PodDisruptionBudget the eviction API honours; the graph is Ready and its
SpecWarnings condition says that minAvailable cannot start the services as one gang here."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator

import pytest

from tests.integration.operator.conftest import Kubectl, OperatorProcess, example, wait_until

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
