"""Gang placement with the real scheduler: scheduler-plugins' kube-scheduler with its coscheduling plugin
(built from its Go module by hack/build-binaries.sh) runs beside the default scheduler, its PodGroup CRD
installed; the operator detects it (--gang-scheduler auto). A v1beta1 graph of 2 prefill + 2 decode
workers of 4 GPUs each that sets minAvailable is one gang: while a pod of another workload holds 2 of the
cluster's 16 GPUs (3 of the 4 workers would fit), none of the graph's workers is bound to a node; once
that pod is gone, all four are, and the graph is Ready. The graph's PodGroup and its PodDisruptionBudgets
are what the scheduler and the eviction API act on."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator

import pytest

from tests.integration.operator.conftest import Kubectl, OperatorProcess, example, wait_until
from tests.support.cluster import GPU_NODES, GPUS_PER_NODE, LocalCluster

pytestmark = pytest.mark.integration

SCHEDULER = "scheduler-plugins-scheduler"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
GRAPH = "gang"
GPUS_PER_WORKER = 4


@pytest.fixture
def gang_scheduler(kube_cluster: LocalCluster) -> Iterator[None]:
    kube_cluster.start_gang_scheduler(SCHEDULER)
    try:
        yield
    finally:
        kube_cluster.stop_gang_scheduler()


def gpus_held_elsewhere(kc: Kubectl) -> int:
    """GPUs requested by pods of other namespaces (other tests' leftovers, still terminating)."""
    pods = json.loads(kc.cluster.kubectl("get", "pods", "-A", "-o", "json"))["items"]
    return sum(
        int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
        for p in pods
        if p["metadata"]["namespace"] != kc.namespace and p.get("spec", {}).get("nodeName")
        for c in p["spec"]["containers"]
    )


def two_by_two() -> dict:
    """examples/v1beta1/disagg.yaml with 2 prefill and 2 decode workers of 4 GPUs, minAvailable 2 each."""
    graph = copy.deepcopy(example("v1beta1/disagg.yaml"))
    graph["metadata"]["name"] = GRAPH
    for comp in graph["spec"]["components"]:
        if comp["type"] in ("prefill", "decode"):
            comp["replicas"] = 2
            comp["minAvailable"] = 2
            main = comp["podTemplate"]["spec"]["containers"][0]
            main["resources"]["limits"]["nvidia.com/gpu"] = str(GPUS_PER_WORKER)
            flags = main["args"]
            flags[flags.index("--tp") + 1] = str(GPUS_PER_WORKER)
    return graph


def workers(kc: Kubectl) -> list[dict]:
    return [
        p for p in kc.list("pods", f"{POD_GROUP_LABEL}={GRAPH}") if not p["metadata"].get("deletionTimestamp")
    ]


def bound(pods: list[dict]) -> list[str]:
    return [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]


def blocker(gpus: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "blocker"},
        "spec": {
            "containers": [
                {"name": "c", "image": "busybox:1.37", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
            "tolerations": [{"operator": "Exists"}],
        },
    }


def test_a_graph_that_does_not_fit_starts_none_of_its_pods_then_all(
    kc: Kubectl, gang_scheduler: None, operator_factory: Callable[..., OperatorProcess]
):
    total = len(GPU_NODES) * GPUS_PER_NODE
    wait_until(lambda: gpus_held_elsewhere(kc) == 0, "no other test's pod holding GPUs", timeout=120)
    # 2 GPUs taken: 14 free, the graph needs 16 (four pods of 4; three would fit one by one)
    kc.apply(blocker(2))
    wait_until(lambda: (kc.get("pod", "blocker") or {}).get("spec", {}).get("nodeName"), "the blocker bound")
    assert total == 4 * GPUS_PER_WORKER and total - 2 >= 3 * GPUS_PER_WORKER

    operator = operator_factory()  # --gang-scheduler auto: the PodGroup CRD is installed
    kc.apply(two_by_two())
    pod_group = wait_until(lambda: kc.get("podgroup", GRAPH), "the graph's PodGroup")
    assert pod_group["spec"]["minMember"] == 4
    pods = wait_until(lambda: (lambda ps: ps if len(ps) == 4 else None)(workers(kc)), "four gang pods")
    assert {p["spec"]["schedulerName"] for p in pods} == {SCHEDULER}

    def refused() -> list[dict] | None:
        pods = workers(kc)
        tried = [
            p
            for p in pods
            if any(
                c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
                for c in p.get("status", {}).get("conditions", [])
            )
        ]
        return pods if len(tried) == len(pods) == 4 else None

    pods = wait_until(refused, "the gang scheduler to refuse every pod of the gang", timeout=90)
    assert bound(pods) == []
    assert kc.condition(GRAPH)["status"] == "False"

    budgets = {b["metadata"]["name"]: b["spec"]["minAvailable"] for b in kc.list("poddisruptionbudgets")}
    assert budgets == {f"{GRAPH}-prefill": 2, f"{GRAPH}-decode": 2}

    kc.delete("pod", "blocker", "--wait=false")
    wait_until(lambda: len(bound(workers(kc))) == 4, "all four gang pods bound", timeout=120)
    kc.wait_ready(GRAPH, timeout=120)
    assert operator.alive()
