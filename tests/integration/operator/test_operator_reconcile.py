"""Single-node reconciliation against the real apiserver + controller-manager + scheduler + kwok:
examples reach Ready with owned children; scaling, drift (deleted/edited children), removed services,
invalid specs, operator restarts and graph deletion all converge to the spec; `kubectl get dgd` and
`kubectl wait --for=condition=Ready` work. The operator runs as a real subprocess."""

from __future__ import annotations

import pytest

from tests.integration.operator.conftest import (
    EXAMPLES,
    Kubectl,
    OperatorProcess,
    condition_of,
    example,
    wait_until,
)

pytestmark = pytest.mark.integration

GRAPH_LABEL = "nvidia.com/dynamo-graph-deployment-name"


def children(kc: Kubectl, graph: str) -> list[dict]:
    selector = f"app.kubernetes.io/managed-by=dynamo-sglang-operator,{GRAPH_LABEL}={graph}"
    return [o for kind in ("deployments", "statefulsets", "services") for o in kc.list(kind, selector)]


def names(objs: list[dict]) -> list[tuple[str, str]]:
    return sorted((o["kind"], o["metadata"]["name"]) for o in objs)


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (
            "agg.yaml",
            [
                ("Deployment", "sglang-agg-decode"),
                ("Deployment", "sglang-agg-frontend"),
                ("Service", "sglang-agg-frontend"),
            ],
        ),
        (
            "disagg.yaml",
            [
                ("Deployment", "sglang-disagg-decode"),
                ("Deployment", "sglang-disagg-frontend"),
                ("Deployment", "sglang-disagg-prefill"),
                ("Service", "sglang-disagg-frontend"),
            ],
        ),
    ],
)
def test_example_reaches_ready_with_owned_children(
    kc: Kubectl, operator: OperatorProcess, manifest, expected
):
    dgd = example(manifest)
    name = dgd["metadata"]["name"]
    kc.apply(dgd)
    obj = kc.wait_ready(name)
    uid = obj["metadata"]["uid"]
    kids = children(kc, name)
    assert names(kids) == expected
    for kid in kids:
        refs = kid["metadata"]["ownerReferences"]
        assert refs == [
            {
                "apiVersion": "nvidia.com/v1beta1",  # the stored version: GC needs no conversion
                "kind": "DynamoGraphDeployment",
                "name": name,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    status = obj["status"]
    assert status["state"] == "successful"
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert status["groupBackend"] == "statefulset"
    for service, spec in dgd["spec"]["services"].items():
        want = spec.get("replicas", 1)
        assert (
            status["services"][service].items()
            >= {"replicas": want, "readyReplicas": want, "updatedReplicas": want}.items()
        )
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "AllServicesReady")
    created = kc.events(name, "Created")
    assert len(created) == len(expected)

    table = kc.run("get", "dgd", name)
    header, row = table.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "READY", "BACKEND", "STATE", "AGE"]
    assert row.split()[:4] == [name, "True", "sglang", "successful"]
    assert operator.alive()


def test_backend_defaults_to_sglang_in_kubectl_get(kc: Kubectl, operator: OperatorProcess):
    """A Dynamo manifest may omit backendFramework: the CRD defaults it, so the BACKEND column says so."""
    dgd = example("agg.yaml")
    del dgd["spec"]["backendFramework"]
    kc.apply(dgd)
    kc.wait_ready("sglang-agg")
    row = kc.run("get", "dgd", "sglang-agg").splitlines()[1]
    assert row.split()[:3] == ["sglang-agg", "True", "sglang"]


def test_scaling_a_service_leaves_others_untouched(kc: Kubectl, operator: OperatorProcess):
    kc.apply(example("disagg.yaml"))
    kc.wait_ready("sglang-disagg")
    before = {d["metadata"]["name"]: d for d in kc.list("deployments")}
    kc.patch("dgd", "sglang-disagg", {"spec": {"services": {"decode": {"replicas": 2}}}})
    wait_until(
        lambda: (
            (kc.get("deployment", "sglang-disagg-decode") or {}).get("status", {}).get("readyReplicas") == 2
        ),
        "decode to have 2 ready pods",
    )
    obj = wait_until(
        lambda: (
            (o := kc.get("dgd", "sglang-disagg"))
            and o["status"].get("observedGeneration") == o["metadata"]["generation"]
            and o["status"]["services"]["decode"]["readyReplicas"] == 2
            and (condition_of(o) or {}).get("status") == "True"
            and o
        ),
        "the graph to report 2 ready decode replicas and Ready",
    )
    assert (
        obj["status"]["services"]["decode"].items()
        >= {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2}.items()
    )
    after = {d["metadata"]["name"]: d for d in kc.list("deployments")}
    for other in ("sglang-disagg-prefill", "sglang-disagg-frontend"):
        assert after[other]["metadata"]["generation"] == before[other]["metadata"]["generation"]
    assert after["sglang-disagg-decode"]["spec"]["replicas"] == 2
    updated = [e["message"] for e in kc.events("sglang-disagg", "Updated")]
    assert updated == ["Updated Deployment sglang-disagg-decode"]


def test_deleted_and_edited_children_are_restored(kc: Kubectl, operator: OperatorProcess):
    kc.apply(example("agg.yaml"))
    kc.wait_ready("sglang-agg")
    old_uid = kc.get("deployment", "sglang-agg-decode")["metadata"]["uid"]
    kc.delete("deployment", "sglang-agg-decode")
    restored = wait_until(
        lambda: (d := kc.get("deployment", "sglang-agg-decode")) and d["metadata"]["uid"] != old_uid and d,
        "the deleted Deployment to be recreated",
    )
    assert restored["metadata"]["ownerReferences"][0]["kind"] == "DynamoGraphDeployment"
    kc.delete("service", "sglang-agg-frontend")
    wait_until(lambda: kc.get("service", "sglang-agg-frontend"), "the deleted Service to be recreated")

    kc.patch("deployment", "sglang-agg-frontend", {"spec": {"replicas": 3}})
    wait_until(
        lambda: kc.get("deployment", "sglang-agg-frontend")["spec"]["replicas"] == 1,
        "the edited Deployment to be put back to 1 replica",
    )
    kc.wait_ready("sglang-agg")


def test_removed_service_children_are_deleted(kc: Kubectl, operator: OperatorProcess):
    dgd = example("agg.yaml")
    dgd["spec"]["services"]["extra"] = dgd["spec"]["services"]["decode"]
    kc.apply(dgd)
    kc.wait_ready("sglang-agg")
    assert kc.get("deployment", "sglang-agg-extra") is not None
    kc.patch("dgd", "sglang-agg", [{"op": "remove", "path": "/spec/services/extra"}], type_="json")
    wait_until(
        lambda: kc.get("deployment", "sglang-agg-extra") is None, "the removed service's Deployment to go"
    )
    obj = wait_until(
        lambda: (
            (o := kc.get("dgd", "sglang-agg"))
            and o["status"]["observedGeneration"] == o["metadata"]["generation"]
            and "extra" not in o["status"]["services"]
            and o
        ),
        "the removed service to leave status",
    )
    assert sorted(obj["status"]["services"]) == ["Frontend", "decode"]
    assert kc.events("sglang-agg", "Deleted")
    assert kc.get("deployment", "sglang-agg-decode") is not None


def test_invalid_spec_is_reported_and_then_fixed(kc: Kubectl, operator: OperatorProcess):
    dgd = example("agg.yaml")
    del dgd["spec"]["services"]["decode"]["resources"]
    kc.apply(dgd)
    cond = wait_until(
        lambda: (c := kc.condition("sglang-agg")) and c["status"] == "False" and c,
        "Ready=False on the invalid spec",
    )
    assert cond["reason"] == "MissingGpuLimit"
    assert "spec.services.decode.resources.limits.gpu" in cond["message"]
    assert kc.get("dgd", "sglang-agg")["status"]["state"] == "failed"
    events = wait_until(lambda: kc.events("sglang-agg", "MissingGpuLimit"), "a Warning Event")
    assert events[0]["type"] == "Warning" and "resources.limits.gpu" in events[0]["message"]
    assert children(kc, "sglang-agg") == []
    assert operator.alive()

    kc.apply(example("agg.yaml"))  # the fix
    kc.wait_ready("sglang-agg")
    assert len(kc.events("sglang-agg", "MissingGpuLimit")) == 1  # reported once, not on every visit


def test_object_the_apiserver_rejects_is_reported_and_then_fixed(kc: Kubectl, operator: OperatorProcess):
    """A wrong type under extraPodSpec passes the CRD schema (it preserves unknown fields) and
    server-side apply answers it with a 500, not a 422: still a spec error, reported as such."""
    dgd = example("agg.yaml")
    dgd["spec"]["services"]["decode"]["extraPodSpec"]["tolerations"] = "not-a-list"
    kc.apply(dgd)
    cond = wait_until(
        lambda: (c := kc.condition("sglang-agg")) and c["status"] == "False" and c,
        "Ready=False on the rejected object",
    )
    assert cond["reason"] == "ApplyFailed"
    assert "Deployment sglang-agg-decode" in cond["message"] and "tolerations" in cond["message"]
    assert kc.get("dgd", "sglang-agg")["status"]["state"] == "failed"
    events = wait_until(lambda: kc.events("sglang-agg", "ApplyFailed"), "a Warning Event")
    assert events[0]["type"] == "Warning"
    assert operator.alive()

    kc.apply(example("agg.yaml"))  # the fix
    kc.wait_ready("sglang-agg")


def test_operator_restart_converges_without_duplicates(
    kc: Kubectl, operator: OperatorProcess, operator_factory
):
    kc.apply(example("disagg.yaml"))
    kc.wait_ready("sglang-disagg")
    operator.stop()
    # While the operator is down: scale a service and delete a child. Without the operator there is no
    # conversion webhook, so the edit is made at v1beta1, the stored version (docs/kubernetes.md).
    beta = Kubectl(kc.cluster, kc.namespace, dgd_resource="dynamographdeployments.v1beta1.nvidia.com")
    comps = [c["name"] for c in beta.get("dgd", "sglang-disagg")["spec"]["components"]]
    edit = [{"op": "replace", "path": f"/spec/components/{comps.index('prefill')}/replicas", "value": 2}]
    beta.patch("dgd", "sglang-disagg", edit, type_="json")
    kc.delete("deployment", "sglang-disagg-decode")
    operator_factory()
    wait_until(lambda: kc.get("deployment", "sglang-disagg-decode"), "the deleted Deployment to come back")
    obj = wait_until(
        lambda: (
            (o := kc.get("dgd", "sglang-disagg"))
            and o["status"]["observedGeneration"] == o["metadata"]["generation"]
            and o["status"]["services"]["prefill"]["readyReplicas"] == 2
            and (condition_of(o) or {}).get("status") == "True"
            and o
        ),
        "the restarted operator to converge",
    )
    assert obj["status"]["state"] == "successful"
    assert names(children(kc, "sglang-disagg")) == [
        ("Deployment", "sglang-disagg-decode"),
        ("Deployment", "sglang-disagg-frontend"),
        ("Deployment", "sglang-disagg-prefill"),
        ("Service", "sglang-disagg-frontend"),
    ]
    assert len(kc.list("pods")) == 4
    created = sorted(e["message"] for e in kc.events("sglang-disagg", "Created"))
    # Each child created once, plus the one deleted while the operator was down: no duplicates.
    assert created.count("Created Deployment sglang-disagg-decode") == 2
    assert created.count("Created Deployment sglang-disagg-prefill") == 1


def test_deleting_the_graph_garbage_collects_everything(kc: Kubectl, operator: OperatorProcess):
    kc.apply(example("disagg.yaml"))
    kc.wait_ready("sglang-disagg")
    assert children(kc, "sglang-disagg")
    kc.delete("dgd", "sglang-disagg", "--wait=true", "--timeout=60s")
    wait_until(lambda: not children(kc, "sglang-disagg"), "the garbage collector to delete every child")
    wait_until(lambda: not kc.list("pods"), "every pod to be gone")
    assert operator.alive()


@pytest.mark.parametrize(
    "manifest",
    sorted(p.name for p in EXAMPLES.glob("*.yaml") if p.name not in ("agg.yaml", "disagg.yaml")),
)
def test_every_other_example_reaches_ready(kc: Kubectl, operator: OperatorProcess, manifest: str):
    dgd = example(manifest)
    kc.apply(dgd)
    obj = kc.wait_ready(dgd["metadata"]["name"])
    assert obj["status"]["state"] == "successful"
    assert sorted(obj["status"]["services"]) == sorted(dgd["spec"]["services"])


def test_transport_is_stated_in_a_condition_and_an_event(kc: Kubectl, operator: OperatorProcess):
    kc.apply(example("disagg.yaml"))
    kc.wait_ready("sglang-disagg")
    cond = kc.condition("sglang-disagg", "Transport")
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "TcpTransport")
    assert "TCP" in cond["message"]
    assert kc.events("sglang-disagg", "TcpTransport")[0]["type"] == "Normal"

    kc.run("annotate", "dgd", "sglang-disagg", "nvidia.com/rdma=true")
    cond = wait_until(
        lambda: (c := kc.condition("sglang-disagg", "Transport")) and c["reason"] == "RdmaTransport" and c,
        "the Transport condition to say RDMA",
    )
    assert kc.events("sglang-disagg", "RdmaTransport")
    pod_spec = kc.get("deployment", "sglang-disagg-decode")["spec"]["template"]["spec"]
    main = next(c for c in pod_spec["containers"] if c["name"] == "main")
    assert "IPC_LOCK" in main["securityContext"]["capabilities"]["add"]
    assert main["resources"]["limits"]["rdma/ib"] == "1"
    kc.wait_ready("sglang-disagg")


def test_unschedulable_worker_is_explained_in_the_ready_message(kc: Kubectl, operator: OperatorProcess):
    """A worker asking for 9 GPUs fits no node (2 kwok nodes of 8): the scheduler's reason shows up in
    the graph's Ready message, naming the pod."""
    dgd = example("agg.yaml")
    dgd["spec"]["services"]["decode"]["resources"]["limits"]["gpu"] = "9"
    kc.apply(dgd)

    def explained() -> dict | None:
        cond = kc.condition("sglang-agg")
        message = (cond or {}).get("message", "")
        # the frontend fits and becomes ready; the decode Deployment's status counts its pod
        settled = "Frontend" not in message and "exist)" not in message
        return cond if settled and "Insufficient nvidia.com/gpu" in message else None

    cond = wait_until(explained, "the Ready message to name Insufficient nvidia.com/gpu (frontend ready)")
    assert (cond["status"], cond["reason"]) == ("False", "ServicesNotReady")
    assert "Waiting for decode 0/1 replicas ready" in cond["message"]
    assert ", pod sglang-agg-decode-" in cond["message"]
    assert " is Unschedulable: 0/" in cond["message"]
