"""Rendering multinode workers (multinode.nodeCount: N): one group per replica, as a LeaderWorkerSet or
as a headless Service + leader StatefulSet + worker StatefulSet; leader address, ranks from the pod
index label, SGLang distributed flags, probes only on the leader, nothing injected for single node."""

from __future__ import annotations

import pytest
from dynamo_api.models import DynamoGraphDeployment
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import GroupPlan, Workload, render

ARGS = ["--model-path", "m", "--tp", "8"]


def _dgd(replicas: int = 1, nodes: int = 2, gpu: str = "4", args: list[str] = ARGS) -> DynamoGraphDeployment:
    return DynamoGraphDeployment.model_validate(
        {
            "metadata": {"name": "g", "namespace": "ns", "uid": "u"},
            "spec": {
                "services": {
                    "Frontend": {"componentType": "frontend"},
                    "decode": {
                        "componentType": "worker",
                        "replicas": replicas,
                        "multinode": {"nodeCount": nodes},
                        "resources": {"limits": {"gpu": gpu}},
                        "extraPodSpec": {
                            "mainContainer": {
                                "command": ["python3", "-m", "dynamo_worker.sglang"],
                                "args": args,
                            }
                        },
                    },
                }
            },
        }
    )


def _main(template: dict) -> dict:
    return template["spec"]["containers"][0]


LEADER_HOST = "g-decode-0-0.g-decode-0.ns.svc"


def _multinode_env(rank: dict) -> list[dict]:
    return [
        rank,
        {"name": "DYN_NUM_NODES", "value": "2"},
        {"name": "DYN_LEADER_HOST", "value": LEADER_HOST},
        {"name": "DYN_LEADER_SYSTEM_ADDR", "value": f"{LEADER_HOST}:9090"},
    ]


def _flags(rank: str) -> list[str]:
    return [*ARGS, "--dist-init-addr", f"{LEADER_HOST}:29500", "--nnodes", "2", "--node-rank", rank]


def test_statefulset_group():
    rendered = render(_dgd(), OperatorConfig(group_backend="statefulset"))
    assert rendered.problems == ()
    headless, leader, worker = rendered.objects[2:]
    assert headless["metadata"]["name"] == "g-decode-0"
    assert headless["spec"] == {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": {
            "nvidia.com/dynamo-graph-deployment-name": "g",
            "nvidia.com/dynamo-component": "decode",
            "nvidia.com/dynamo-group": "g-decode-0",
        },
        "ports": [{"name": "dist-init", "port": 29500, "targetPort": 29500}],
    }
    assert (leader["kind"], leader["metadata"]["name"]) == ("StatefulSet", "g-decode-0")
    assert (worker["kind"], worker["metadata"]["name"]) == ("StatefulSet", "g-decode-0-w")
    for sts, pods in ((leader, 1), (worker, 1)):
        assert sts["spec"]["replicas"] == pods
        assert sts["spec"]["serviceName"] == "g-decode-0"
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert "ordinals" not in leader["spec"] and worker["spec"]["ordinals"] == {"start": 1}
    assert leader["spec"]["selector"]["matchLabels"]["nvidia.com/dynamo-multinode-role"] == "leader"
    assert worker["spec"]["template"]["metadata"]["labels"]["nvidia.com/dynamo-group"] == "g-decode-0"

    lead, work = _main(leader["spec"]["template"]), _main(worker["spec"]["template"])
    assert lead["args"] == _flags("0")
    assert work["args"] == _flags("$(DYN_NODE_RANK)")
    assert lead["env"][-4:] == _multinode_env({"name": "DYN_NODE_RANK", "value": "0"})
    assert work["env"][-4:] == _multinode_env(
        {
            "name": "DYN_NODE_RANK",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}},
        }
    )
    assert {"livenessProbe", "readinessProbe", "startupProbe"} <= set(lead)
    assert not {"livenessProbe", "readinessProbe", "startupProbe"} & set(work)
    assert lead["resources"] == work["resources"] == {"limits": {"nvidia.com/gpu": "4"}}

    plan = rendered.services["decode"]
    assert (plan.kind, plan.replicas, plan.nodes_per_replica) == ("StatefulSet", 1, 2)
    assert plan.children == ("g-decode-0", "g-decode-0-w")
    assert plan.groups == (
        GroupPlan(
            "g-decode-0",
            LEADER_HOST,
            (Workload("StatefulSet", "g-decode-0", 1), Workload("StatefulSet", "g-decode-0-w", 1)),
            headless_service="g-decode-0",
        ),
    )
    assert rendered.notices == ()


def test_leader_worker_set_group():
    rendered = render(_dgd(), OperatorConfig(group_backend="lws"))
    (lws,) = rendered.objects[2:]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws["metadata"]["name"] == "g-decode-0"
    spec = lws["spec"]
    assert (spec["replicas"], spec["startupPolicy"]) == (1, "LeaderCreated")
    template = spec["leaderWorkerTemplate"]
    assert (template["size"], template["restartPolicy"]) == (2, "RecreateGroupOnPodRestart")
    lead, work = _main(template["leaderTemplate"]), _main(template["workerTemplate"])
    assert lead["args"] == _flags("0")
    assert work["args"] == _flags("$(DYN_NODE_RANK)")
    assert work["env"][-4]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['leaderworkerset.sigs.k8s.io/worker-index']"
    )
    assert "readinessProbe" in lead and "readinessProbe" not in work
    plan = rendered.services["decode"]
    assert plan.kind == "LeaderWorkerSet" and plan.children == ("g-decode-0",)
    assert plan.groups[0].workloads == (Workload("LeaderWorkerSet", "g-decode-0", 2),)


@pytest.mark.parametrize("backend", ["lws", "statefulset"])
def test_replicas_are_whole_groups(backend):
    rendered = render(_dgd(replicas=3, nodes=4, gpu="2"), OperatorConfig(group_backend=backend))
    plan = rendered.services["decode"]
    assert plan.replicas == 3 and plan.nodes_per_replica == 4
    assert [g.name for g in plan.groups] == ["g-decode-0", "g-decode-1", "g-decode-2"]
    assert [g.leader_host for g in plan.groups][1] == "g-decode-1-0.g-decode-1.ns.svc"
    pods = sum(w.pods for g in plan.groups for w in g.workloads)
    assert pods == 12
    assert render(_dgd(replicas=0), OperatorConfig(group_backend=backend)).services["decode"].children == ()


def test_parallelism_that_does_not_fill_the_group_is_refused():
    # --tp-size 4 on a two-node group of 4 GPUs each: SGLang spreads one engine over every node
    rendered = render(_dgd(args=["--tp-size", "4"]), OperatorConfig())
    (problem,) = rendered.problems
    assert (problem.field, problem.reason) == (
        "spec.services.decode.extraPodSpec.mainContainer.args",
        "ParallelismMismatch",
    )
    assert problem.message == (
        "Worker 'decode' runs an engine of 4 GPUs (--tp 4 x --pp-size 1 x --dp-size 1) on 2 pods x 4 GPUs "
        "= 8: SGLang spreads one engine over all nodes of a group, so it cannot use them; set --tp to 8 or "
        "resources.limits.gpu and multinode.nodeCount so that nodes x gpu = 4."
    )
    assert rendered.objects == ()
    too_big = render(_dgd(args=["--tp", "16"]), OperatorConfig())
    assert [p.reason for p in too_big.problems] == ["ParallelismMismatch"]
    assert "it cannot start" in too_big.problems[0].message


def test_fewer_gpus_than_a_single_pod_has_is_a_warning():
    body = _dgd(args=["--tp", "2"]).model_dump(by_alias=True, exclude_none=True)
    del body["spec"]["services"]["decode"]["multinode"]
    rendered = render(DynamoGraphDeployment.model_validate(body), OperatorConfig())
    (notice,) = rendered.notices
    assert (notice.reason, notice.service, notice.warning) == ("TpMismatch", "decode", True)
    assert notice.message == (
        "Service 'decode' runs --tp 2 (engine needs 2 GPUs) on 1 pod(s) x 4 GPU(s) = 4; "
        "set --tp to 4, or resources.limits.gpu so that pods x gpu = 2."
    )
    body["spec"]["services"]["decode"]["extraPodSpec"]["mainContainer"]["args"] = ["--tp", "8"]
    refused = render(DynamoGraphDeployment.model_validate(body), OperatorConfig())
    assert [p.reason for p in refused.problems] == ["ParallelismMismatch"]


def test_single_node_gets_no_distributed_flags():
    body = _dgd().model_dump(by_alias=True, exclude_none=True)
    del body["spec"]["services"]["decode"]["multinode"]
    body["spec"]["services"]["decode"]["resources"]["limits"]["gpu"] = "8"
    rendered = render(DynamoGraphDeployment.model_validate(body), OperatorConfig())
    deployment = rendered.objects[-1]
    assert deployment["kind"] == "Deployment"
    main = deployment["spec"]["template"]["spec"]["containers"][0]
    assert main["args"] == ARGS
    assert not [e for e in main["env"] if e["name"].startswith(("DYN_NODE", "DYN_NUM", "DYN_LEADER"))]
