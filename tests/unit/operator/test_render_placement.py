"""Where a graph's pods go (render.placement), from v1beta1 manifests: the graph's labels, annotations and
priorityClassName reach every pod (the service's own win); minAvailable becomes a PodDisruptionBudget and,
with a gang scheduler, one PodGroup for the graph whose pods carry its label and schedulerName; each
multinode group of a service without minAvailable is a gang of its own; topologyConstraint becomes a
required pod affinity on the pack domain's node label (per group for multinode services); an unknown pack
domain is refused with the fix; without a gang scheduler minAvailable is a warning, and the v1beta1
fields this operator does not act on are named in one."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from dynamo_api.conversion import load_graph, to_v1alpha1
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render

REPO = Path(__file__).resolve().parents[3]
DISAGG = yaml.safe_load((REPO / "examples" / "v1beta1" / "disagg.yaml").read_text())
GANG = OperatorConfig(gang_scheduler="coscheduling")


def _graph(**spec: object) -> dict:
    graph = copy.deepcopy(DISAGG)
    graph["metadata"]["uid"] = "u"
    graph["spec"].update(spec)
    return graph


def _component(graph: dict, name: str) -> dict:
    return next(c for c in graph["spec"]["components"] if c["name"] == name)


def _objects(rendered, kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in rendered.objects if o["kind"] == kind}


def test_graph_labels_annotations_and_priority_reach_every_pod():
    graph = _graph(
        labels={"team": "a", "tier": "x"}, annotations={"owner": "ops"}, priorityClassName="serving"
    )
    _component(graph, "decode")["podTemplate"]["metadata"] = {"labels": {"tier": "gpu"}}
    _component(graph, "prefill")["podTemplate"]["spec"]["priorityClassName"] = "batch"
    rendered = render(load_graph(graph), OperatorConfig())
    assert rendered.problems == ()
    deployments = _objects(rendered, "Deployment")
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]
        assert pod["metadata"]["labels"]["team"] == "a" and pod["metadata"]["annotations"]["owner"] == "ops"
        assert deployment["metadata"]["labels"]["team"] == "a"
        assert pod["spec"]["priorityClassName"] == ("batch" if name.endswith("prefill") else "serving")
    assert deployments["sglang-disagg-decode"]["spec"]["template"]["metadata"]["labels"]["tier"] == "gpu"
    assert deployments["sglang-disagg-frontend"]["spec"]["template"]["metadata"]["labels"]["tier"] == "x"
    # the same from the v1alpha1 form that keeps them in its annotation
    assert render(load_graph(to_v1alpha1(graph)), OperatorConfig()).objects == rendered.objects


def test_min_available_is_a_budget_and_with_a_gang_scheduler_one_pod_group():
    graph = _graph()
    for name in ("prefill", "decode"):
        _component(graph, name).update(replicas=3, minAvailable=2)
    rendered = render(load_graph(graph), GANG)
    budgets = _objects(rendered, "PodDisruptionBudget")
    assert {n: b["spec"] for n, b in budgets.items()} == {
        f"sglang-disagg-{n}": {
            "minAvailable": 2,
            "selector": {
                "matchLabels": {
                    "nvidia.com/dynamo-graph-deployment-name": "sglang-disagg",
                    "nvidia.com/dynamo-component": n,
                }
            },
        }
        for n in ("prefill", "decode")
    }
    (group,) = _objects(rendered, "PodGroup").values()
    assert (group["apiVersion"], group["metadata"]["name"], group["spec"]) == (
        "scheduling.x-k8s.io/v1alpha1",
        "sglang-disagg",
        {"minMember": 4},
    )
    deployments = _objects(rendered, "Deployment")
    for name in ("prefill", "decode"):
        pod = deployments[f"sglang-disagg-{name}"]["spec"]["template"]
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "sglang-disagg"
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    frontend = deployments["sglang-disagg-frontend"]["spec"]["template"]
    assert "schedulerName" not in frontend["spec"]
    assert "scheduling.x-k8s.io/pod-group" not in frontend["metadata"]["labels"]
    without = render(load_graph(graph), OperatorConfig())
    assert not _objects(without, "PodGroup") and _objects(without, "PodDisruptionBudget")
    (warning,) = [n for n in without.notices if n.warning]
    assert warning.reason == "GangSchedulerMissing" and "decode, prefill set minAvailable" in warning.message


def test_multinode_groups_are_gangs_of_their_own():
    graph = _graph()
    decode = _component(graph, "decode")
    decode.update(replicas=2, multinode={"nodeCount": 2})
    flags = decode["podTemplate"]["spec"]["containers"][0]["args"]
    flags[flags.index("--tp") + 1] = "2"
    rendered = render(load_graph(graph), GANG)
    groups = {n: g["spec"]["minMember"] for n, g in _objects(rendered, "PodGroup").items()}
    assert groups == {"sglang-disagg-decode-0": 2, "sglang-disagg-decode-1": 2}
    for name, sts in _objects(rendered, "StatefulSet").items():
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert labels["scheduling.x-k8s.io/pod-group"] == labels["nvidia.com/dynamo-group"], name


def test_topology_constraint_is_a_required_pod_affinity():
    graph = _graph(topologyConstraint={"topologyProfile": "cluster", "packDomain": "zone"})
    decode = _component(graph, "decode")
    decode["topologyConstraint"] = {"packDomain": "rack"}
    config = OperatorConfig(
        topology_domains={"zone": "topology.kubernetes.io/zone", "rack": "example.com/rack"}
    )
    rendered = render(load_graph(graph), config)
    deployments = _objects(rendered, "Deployment")
    terms = deployments["sglang-disagg-decode"]["spec"]["template"]["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms == [
        {
            "labelSelector": {"matchLabels": {"nvidia.com/dynamo-graph-deployment-name": "sglang-disagg"}},
            "topologyKey": "topology.kubernetes.io/zone",
        },
        {
            "labelSelector": {
                "matchLabels": {
                    "nvidia.com/dynamo-graph-deployment-name": "sglang-disagg",
                    "nvidia.com/dynamo-component": "decode",
                }
            },
            "topologyKey": "example.com/rack",
        },
    ]
    prefill = deployments["sglang-disagg-prefill"]["spec"]["template"]["spec"]["affinity"]["podAffinity"]
    assert [t["topologyKey"] for t in prefill["requiredDuringSchedulingIgnoredDuringExecution"]] == [
        "topology.kubernetes.io/zone"
    ]
    refused = render(load_graph(graph), OperatorConfig())
    (problem,) = refused.problems
    assert (problem.field, problem.reason) == (
        "spec.services.decode.topologyConstraint.packDomain",
        "UnknownPackDomain",
    )
    assert "--topology-domains" in problem.message and "'rack'" in problem.message


def test_fields_not_acted_on_are_named_in_a_warning():
    graph = _graph(restart={"id": "1"})
    _component(graph, "decode")["compilationCache"] = {"pvcName": "cache"}
    (warning,) = [n for n in render(load_graph(graph), OperatorConfig()).notices if n.warning]
    assert warning.reason == "IgnoredFields"
    assert "spec.restart, decode.compilationCache" in warning.message


def test_a_v1alpha1_graph_places_its_labels_priority_and_topology_as_v1beta1_does():
    """Dynamo's current v1alpha1 has the graph's labels, annotations, priorityClassName and
    topologyConstraint too (and a service's topologyConstraint): written there, they render as the
    same fields written at v1beta1."""
    spec = {
        "labels": {"team": "a"},
        "annotations": {"owner": "ops"},
        "priorityClassName": "serving",
        "topologyConstraint": {"packDomain": "zone"},
    }
    beta = _graph(**spec)
    _component(beta, "decode")["topologyConstraint"] = {"packDomain": "host"}
    alpha = to_v1alpha1(beta)
    alpha["metadata"].pop("annotations", None)  # the fields live in the v1alpha1 spec, not a record
    assert {k: alpha["spec"][k] for k in spec} == spec
    assert alpha["spec"]["services"]["decode"]["topologyConstraint"] == {"packDomain": "host"}
    rendered = render(load_graph(alpha), OperatorConfig())
    assert rendered.problems == ()
    assert rendered.objects == render(load_graph(beta), OperatorConfig()).objects
    decode = _objects(rendered, "Deployment")["sglang-disagg-decode"]
    assert decode["metadata"]["labels"]["team"] == "a"
    assert decode["spec"]["template"]["spec"]["priorityClassName"] == "serving"
    terms = decode["spec"]["template"]["spec"]["affinity"]["podAffinity"]
    assert [t["topologyKey"] for t in terms["requiredDuringSchedulingIgnoredDuringExecution"]] == [
        "topology.kubernetes.io/zone",
        "kubernetes.io/hostname",
    ]


def test_epp_config_gpu_memory_service_and_a_topology_profile_are_named_in_spec_warnings():
    """Accepted (the API server keeps them) and not acted on: each is named, whichever version wrote it."""
    beta = _graph(topologyConstraint={"topologyProfile": "gb200-nvl72"})
    decode = _component(beta, "decode")
    decode["eppConfig"] = {"configMapRef": {"name": "epp"}}
    decode["experimental"] = {"gpuMemoryService": {"mode": "IntraPod"}}
    for graph in (beta, to_v1alpha1(beta)):
        warnings = [n for n in render(load_graph(graph), OperatorConfig()).notices if n.warning]
        text = " | ".join(n.message for n in warnings)
        assert {n.reason for n in warnings} == {"IgnoredFields"}
        assert "spec.topologyConstraint.topologyProfile" in text
        assert "'decode' sets eppConfig, gpuMemoryService" in text
        assert "decode.experimental" not in text, "gpuMemoryService is named once, by its v1alpha1 name"
    off = to_v1alpha1(beta)
    off["spec"]["services"]["decode"]["gpuMemoryService"] = {"enabled": False}
    text = " | ".join(n.message for n in render(load_graph(off), OperatorConfig()).notices if n.warning)
    assert "gpuMemoryService" not in text
