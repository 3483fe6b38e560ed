"""Operator faults against the real local control plane (etcd, kube-apiserver, controller-manager,
scheduler, kwok) with the operator as a real process: restarted mid-reconcile, a 409 conflict on its
status writes, children deleted or edited behind its back, invalid specs. Each converges, or is
answered with a condition and an Event, within its bound.

Bounds (on 2 busy cores; the operator reacts to watch events, not to a timer):
- ``RESTART_BOUND_S`` 60 s: a SIGKILLed operator's successor finishes the graph, pods Ready included
  (kwok makes pods Running in about a second; the rest is the controller-manager's pace).
- ``CONFLICT_BOUND_S`` 30 s: two status writes refused with 409 are retried on the next visit (the
  operator's backoff is 2 s then 4 s; its children's events often bring the visit sooner) and the
  graph is Ready with its status written.
- ``DRIFT_BOUND_S`` 10 s: a deleted child is recreated, an edited one put back.
- ``INVALID_BOUND_S`` 10 s: an invalid spec is answered with Ready=False naming the field, and an Event.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.kube_conflict_proxy import ConflictProxy
from tests.integration.operator.conftest import Kubectl, OperatorProcess, example, wait_until
from tests.support.cluster import kubeconfig_text

pytestmark = pytest.mark.integration

RESTART_BOUND_S = 60.0
CONFLICT_BOUND_S = 30.0
DRIFT_BOUND_S = 10.0
INVALID_BOUND_S = 10.0
DISAGG_CHILDREN = [
    ("Deployment", "sglang-disagg-decode"),
    ("Deployment", "sglang-disagg-frontend"),
    ("Deployment", "sglang-disagg-prefill"),
    ("Service", "sglang-disagg-frontend"),
]


def children(kc: Kubectl, graph: str) -> list[tuple[str, str]]:
    selector = (
        f"app.kubernetes.io/managed-by=dynamo-sglang-operator,nvidia.com/dynamo-graph-deployment-name={graph}"
    )
    return sorted(
        (o["kind"], o["metadata"]["name"])
        for kind in ("deployments", "services")
        for o in kc.list(kind, selector)
    )


def ready(kc: Kubectl, name: str):
    """The graph when its status (one read) says Ready for its current generation, else None. Read at
    the storage version (v1beta1): while the operator, and so its conversion webhook, is down, a
    v1alpha1 read fails by design (docs/kubernetes.md, "Two API versions")."""
    obj = kc.get("dynamographdeployments.v1beta1.nvidia.com", name)
    status = (obj or {}).get("status") or {}
    if not obj or status.get("observedGeneration") != obj["metadata"]["generation"]:
        return None
    conds = [c for c in status.get("conditions") or [] if c["type"] == "Ready" and c["status"] == "True"]
    return obj if conds else None


def test_operator_sigkilled_mid_reconcile_converges(
    kc: Kubectl, operator: OperatorProcess, operator_factory, fault_row
):
    row = fault_row(
        "operator restart mid-reconcile",
        "nodes cordoned; SIGKILL the operator once a new graph's first child exists; another: Ready, no dups",
        RESTART_BOUND_S,
    )
    # The nodes are cordoned until the operator is gone, so that its pods stay Pending and the graph is
    # certainly not Ready when it dies (kwok makes pods Ready within a second: a loaded machine's test
    # could see the graph finished before it got to the kill).
    nodes = [n["metadata"]["name"] for n in kc.list("nodes")]
    for node in nodes:
        kc.run("cordon", node)
    try:
        kc.apply(example("disagg.yaml"))
        wait_until(lambda: children(kc, "sglang-disagg"), "the first child", timeout=30)
        operator.proc.kill()  # mid-reconcile: the graph is not Ready yet
        operator.stop()
        assert ready(kc, "sglang-disagg") is None
    finally:
        for node in nodes:
            kc.run("uncordon", node)
    restarted = time.monotonic()
    operator_factory()
    wait_until(
        lambda: ready(kc, "sglang-disagg"), "the graph Ready after the restart", timeout=RESTART_BOUND_S * 2
    )
    row.answered(time.monotonic() - restarted)
    assert children(kc, "sglang-disagg") == DISAGG_CHILDREN
    replicas = sum(s.get("replicas", 1) for s in example("disagg.yaml")["spec"]["services"].values())
    assert len(kc.list("pods")) == replicas  # no duplicate ReplicaSets or pods from the two operators
    assert row.within_bound()


def test_conflict_on_status_is_retried(kc: Kubectl, kube_cluster, k8s_namespace, tmp_path, fault_row):
    row = fault_row(
        "apiserver conflict (409) on status",
        "the first 2 status writes answered 409 by a proxy in front of the apiserver: retried, Ready",
        CONFLICT_BOUND_S,
    )
    pki = kube_cluster.dir / "pki"
    proxy = ConflictProxy(kube_cluster.server, pki, conflicts=2).start()
    kubeconfig = tmp_path / "kubeconfig-via-proxy"
    kubeconfig.write_text(kubeconfig_text(proxy.url, pki))
    op = OperatorProcess(kubeconfig, k8s_namespace, tmp_path / "operator.log", cluster=kube_cluster)
    try:
        op.start()
        started = time.monotonic()
        kc.apply(example("agg.yaml"))
        obj = wait_until(lambda: ready(kc, "sglang-agg"), "the graph Ready", timeout=CONFLICT_BOUND_S * 2)
        row.answered(time.monotonic() - started)
        assert proxy.conflicted == 2
        assert obj["status"]["state"] == "successful"
        assert op.alive() and "409" in op.log_path.read_text()
    finally:
        op.stop()
        proxy.stop()
    assert row.within_bound()


def test_deleted_and_edited_children_are_restored(kc: Kubectl, operator: OperatorProcess, fault_row):
    row = fault_row(
        "child deleted / edited",
        "delete a graph's Deployment and Service, scale its frontend Deployment to 3: all put back",
        DRIFT_BOUND_S,
    )
    kc.apply(example("agg.yaml"))
    kc.wait_ready("sglang-agg")
    old_uid = kc.get("deployment", "sglang-agg-decode")["metadata"]["uid"]
    started = time.monotonic()
    kc.delete("deployment", "sglang-agg-decode")
    wait_until(
        lambda: (d := kc.get("deployment", "sglang-agg-decode")) and d["metadata"]["uid"] != old_uid,
        "the Deployment recreated",
        timeout=DRIFT_BOUND_S * 3,
    )
    row.answered(time.monotonic() - started)
    started = time.monotonic()
    kc.delete("service", "sglang-agg-frontend")
    wait_until(
        lambda: kc.get("service", "sglang-agg-frontend"), "the Service recreated", timeout=DRIFT_BOUND_S * 3
    )
    row.answered(time.monotonic() - started)
    started = time.monotonic()
    kc.patch("deployment", "sglang-agg-frontend", {"spec": {"replicas": 3}})
    wait_until(
        lambda: kc.get("deployment", "sglang-agg-frontend")["spec"]["replicas"] == 1,
        "the edit reverted",
        timeout=DRIFT_BOUND_S * 3,
    )
    row.answered(time.monotonic() - started)
    assert row.within_bound()


def test_invalid_specs_are_answered_with_a_condition_and_an_event(
    kc: Kubectl, operator: OperatorProcess, fault_row
):
    row = fault_row(
        "invalid specs",
        "a worker with no GPU limit, and prefill/decode with different --page-size: Ready=False + Event",
        INVALID_BOUND_S,
    )
    no_gpu = example("agg.yaml")
    del no_gpu["spec"]["services"]["decode"]["resources"]
    started = time.monotonic()
    kc.apply(no_gpu)
    cond = wait_until(
        lambda: (c := kc.condition("sglang-agg")) and c["status"] == "False" and c,
        "Ready=False",
        timeout=INVALID_BOUND_S * 3,
    )
    wait_until(lambda: kc.events("sglang-agg", cond["reason"]), "the Event", timeout=INVALID_BOUND_S * 3)
    row.answered(time.monotonic() - started)
    assert "resources.limits.gpu" in cond["message"] and children(kc, "sglang-agg") == []

    pages = example("disagg.yaml")
    args = pages["spec"]["services"]["prefill"]["extraPodSpec"]["mainContainer"]["args"]
    args[args.index("--page-size") + 1] = "32"  # decode keeps its own
    started = time.monotonic()
    kc.apply(pages)
    cond = wait_until(
        lambda: (c := kc.condition("sglang-disagg")) and c["status"] == "False" and c,
        "Ready=False",
        timeout=INVALID_BOUND_S * 3,
    )
    wait_until(lambda: kc.events("sglang-disagg", cond["reason"]), "the Event", timeout=INVALID_BOUND_S * 3)
    row.answered(time.monotonic() - started)
    assert cond["reason"] == "PageSizeMismatch" and "page-size" in cond["message"]
    assert operator.alive()
    assert row.within_bound()
