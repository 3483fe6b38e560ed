"""Multinode groups and SGLang backend rules on the real apiserver + kwok.

StatefulSet backend (no LeaderWorkerSet CRD): N pods per replica with ranks, the leader address and
probes only on the leader; deleting a non-leader pod restarts its whole group; scaling adds and
removes whole groups; the graph is Ready only when every group is. LeaderWorkerSet backend (a
minimal LWS CRD is installed; no LWS controller runs here, so the test asserts the LWS objects and
plays the controller's part by writing their status). A tp that does not fill its group and a
page-size mismatch each produce a clear condition and Event, and nothing is created."""

from __future__ import annotations

import json

import pytest

from tests.integration.operator.conftest import Kubectl, OperatorProcess, condition_of, example, wait_until

pytestmark = pytest.mark.integration

GRAPH = "sglang-agg-multinode"
GROUP_LABEL = "nvidia.com/dynamo-group"
POD_INDEX = "apps.kubernetes.io/pod-index"


def group_pods(kc: Kubectl, group: str) -> list[dict]:
    pods = kc.list("pods", f"{GROUP_LABEL}={group}")
    return sorted(
        (p for p in pods if not p["metadata"].get("deletionTimestamp")), key=lambda p: p["metadata"]["name"]
    )


def running_ready(pods: list[dict]) -> bool:
    return all(
        any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))
        for p in pods
    )


def arg_after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_statefulset_groups_ranks_leader_and_probes(kc: Kubectl, operator: OperatorProcess):
    kc.apply(example("agg-multinode.yaml"))
    obj = kc.wait_ready(GRAPH)
    assert obj["status"]["groupBackend"] == "statefulset"
    assert obj["status"]["services"]["decode"].items() >= {"replicas": 1, "readyReplicas": 1}.items()
    group = f"{GRAPH}-decode-0"
    pods = group_pods(kc, group)
    assert [p["metadata"]["name"] for p in pods] == [f"{group}-0", f"{group}-w-1"]
    leader_host = f"{group}-0.{group}.{kc.namespace}.svc"
    assert kc.get("service", group)["spec"]["clusterIP"] == "None"
    for rank, p in enumerate(pods):
        assert p["metadata"]["labels"][POD_INDEX] == str(rank)
        main = next(c for c in p["spec"]["containers"] if c["name"] == "main")
        args = main["args"]
        assert arg_after(args, "--dist-init-addr") == f"{leader_host}:29500"
        assert arg_after(args, "--nnodes") == "2"
        assert main["resources"]["limits"]["nvidia.com/gpu"] == "4"
        env = {e["name"]: e for e in main["env"]}
        if rank == 0:
            assert arg_after(args, "--node-rank") == "0"
            assert {"livenessProbe", "readinessProbe", "startupProbe"} <= set(main)
        else:
            # The rank comes from the pod's own index label through the downward API.
            assert arg_after(args, "--node-rank") == "$(DYN_NODE_RANK)"
            field_path = env["DYN_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
            assert field_path == f"metadata.labels['{POD_INDEX}']"
            assert not {"livenessProbe", "readinessProbe", "startupProbe"} & set(main)


def test_deleting_a_non_leader_pod_restarts_its_group(kc: Kubectl, operator: OperatorProcess):
    kc.apply(example("agg-multinode.yaml"))
    kc.wait_ready(GRAPH)
    group = f"{GRAPH}-decode-0"
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in group_pods(kc, group)}
    kc.delete("pod", f"{group}-w-1", "--wait=false")

    def restarted() -> dict[str, str] | None:
        pods = group_pods(kc, group)
        now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
        fresh = set(now) == set(before) and all(now[n] != before[n] for n in now)
        return now if fresh and running_ready(pods) else None

    wait_until(restarted, "every pod of the group (the leader too) to be replaced and ready")
    events = wait_until(lambda: kc.events(GRAPH, "GroupRestarted"), "a GroupRestarted Event")
    assert any(f"pod {group}-w-1 was deleted" in e["message"] for e in events)
    kc.wait_ready(GRAPH)
    # The restart's own deletions do not trigger further restarts. (kwok 0.8 sometimes deletes a pod
    # twice by name, and the second delete hits the pod's fresh replacement: a real deletion, which
    # rightly restarts the group once more; a loop would go on forever.)
    assert len(kc.events(GRAPH, "GroupRestarted")) <= 3
    wait_until(lambda: running_ready(p := group_pods(kc, group)) and len(p) == 2, "the group to settle")


def test_scaling_adds_and_removes_whole_groups(kc: Kubectl, operator: OperatorProcess):
    kc.apply(example("agg-multinode.yaml"))
    kc.wait_ready(GRAPH)
    kc.patch("dgd", GRAPH, {"spec": {"services": {"decode": {"replicas": 2}}}})
    g1 = f"{GRAPH}-decode-1"
    pods = wait_until(lambda: (p := group_pods(kc, g1)) and len(p) == 2 and running_ready(p) and p, "group 1")
    assert [p["metadata"]["name"] for p in pods] == [f"{g1}-0", f"{g1}-w-1"]
    obj = wait_until(
        lambda: (
            (o := kc.get("dgd", GRAPH))
            and o["status"]["services"]["decode"].get("readyReplicas") == 2
            and (condition_of(o) or {}).get("status") == "True"
            and o
        ),
        "2 ready groups",
    )
    assert obj["status"]["services"]["decode"]["replicas"] == 2

    kc.patch("dgd", GRAPH, {"spec": {"services": {"decode": {"replicas": 1}}}})
    wait_until(lambda: not kc.list("statefulsets", f"{GROUP_LABEL}={g1}"), "group 1's StatefulSets to go")
    wait_until(lambda: kc.get("service", g1) is None, "group 1's headless Service to go")
    wait_until(lambda: not group_pods(kc, g1), "group 1's pods to go")
    assert len(group_pods(kc, f"{GRAPH}-decode-0")) == 2
    obj = wait_until(
        lambda: (
            (o := kc.get("dgd", GRAPH))
            and o["status"]["services"]["decode"].get("replicas") == 1
            and (condition_of(o) or {}).get("status") == "True"
            and o
        ),
        "1 ready group",
    )


def test_graph_is_ready_only_when_every_group_is(kc: Kubectl, operator: OperatorProcess):
    dgd = example("agg-multinode.yaml")
    decode = dgd["spec"]["services"]["decode"]
    decode["resources"]["limits"]["gpu"] = "8"  # one group takes both fake nodes' 16 GPUs
    decode["extraPodSpec"]["mainContainer"]["args"][
        decode["extraPodSpec"]["mainContainer"]["args"].index("--tp") + 1
    ] = "16"
    kc.apply(dgd)
    kc.wait_ready(GRAPH)
    kc.patch("dgd", GRAPH, {"spec": {"services": {"decode": {"replicas": 2}}}})
    cond = wait_until(
        lambda: (
            (o := kc.get("dgd", GRAPH))
            and o["status"]["observedGeneration"] == o["metadata"]["generation"]
            and (c := kc.condition(GRAPH))["status"] == "False"
            and c
        ),
        "Ready=False while the second group cannot be scheduled",
    )
    assert cond["reason"] == "ServicesNotReady"
    assert "decode 1/2 groups ready" in cond["message"]
    assert kc.get("dgd", GRAPH)["status"]["state"] == "pending"
    kc.patch("dgd", GRAPH, {"spec": {"services": {"decode": {"replicas": 1}}}})
    kc.wait_ready(GRAPH)


def test_leaderworkerset_backend_when_its_crd_is_installed(lws_crd, kc: Kubectl, operator_factory):
    operator_factory()  # --group-backend auto: detects the CRD at start-up
    kc.apply(example("agg-multinode.yaml"))
    group = f"{GRAPH}-decode-0"
    lws = wait_until(lambda: kc.get("leaderworkerset", group), "the LeaderWorkerSet of group 0")
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["metadata"]["ownerReferences"][0]["kind"] == "DynamoGraphDeployment"
    assert not kc.list("statefulsets")
    cond = wait_until(
        lambda: (c := kc.condition(GRAPH)) and c["status"] == "False" and c,
        "Ready=False (no LWS controller here)",
    )
    assert "decode 0/1 groups ready" in cond["message"]
    assert kc.get("dgd", GRAPH)["status"]["groupBackend"] == "lws"

    # Play the LWS controller: report the group ready; the graph follows.
    generation = lws["metadata"]["generation"]
    ready = {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "observedGeneration": generation}
    kc.run(
        "patch",
        "leaderworkerset",
        group,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": ready}),
    )
    kc.wait_ready(GRAPH)

    kc.patch("dgd", GRAPH, {"spec": {"services": {"decode": {"replicas": 2}}}})
    wait_until(lambda: kc.get("leaderworkerset", f"{GRAPH}-decode-1"), "a second LeaderWorkerSet")
    kc.patch("dgd", GRAPH, {"spec": {"services": {"decode": {"replicas": 1}}}})
    wait_until(
        lambda: kc.get("leaderworkerset", f"{GRAPH}-decode-1") is None, "the second LeaderWorkerSet to go"
    )


def test_tp_that_does_not_fill_the_group_is_an_invalid_spec(kc: Kubectl, operator: OperatorProcess):
    # stored without the validating webhook (as while the operator was down): judged at reconcile
    dgd = example("agg-multinode.yaml")
    args = dgd["spec"]["services"]["decode"]["extraPodSpec"]["mainContainer"]["args"]
    args[args.index("--tp") + 1] = "4"  # 2 nodes x 4 GPUs = 8
    kc.apply(dgd)
    cond = wait_until(lambda: (c := kc.condition(GRAPH)) and c["status"] == "False" and c, "Ready=False")
    assert cond["reason"] == "ParallelismMismatch"
    assert "engine of 4 GPUs" in cond["message"] and "set --tp to 8" in cond["message"]
    event = wait_until(lambda: kc.events(GRAPH, "ParallelismMismatch"), "a ParallelismMismatch Event")[0]
    assert event["type"] == "Warning"
    assert not kc.list("statefulsets")  # refused before any pod starts


def test_page_size_mismatch_is_an_invalid_spec(kc: Kubectl, operator: OperatorProcess):
    dgd = example("disagg.yaml")
    args = dgd["spec"]["services"]["prefill"]["extraPodSpec"]["mainContainer"]["args"]
    args[args.index("--page-size") + 1] = "32"
    kc.apply(dgd)
    cond = wait_until(
        lambda: (c := kc.condition("sglang-disagg")) and c["status"] == "False" and c, "Ready=False"
    )
    assert cond["reason"] == "PageSizeMismatch"
    assert "page-size" in cond["message"]
    event = wait_until(lambda: kc.events("sglang-disagg", "PageSizeMismatch"), "a PageSizeMismatch Event")[0]
    assert event["type"] == "Warning"
    assert not kc.list("deployments")  # refused before any pod starts
