"""Scaling adapters: a service that opts in (v1alpha1 ``scalingAdapter: {enabled: true}`` or v1beta1
``scalingAdapter: {}``) gets one DynamoGraphDeploymentScalingAdapter owned by the graph, made with the
service's replicas; a service a planner scales (prefill and decode, or the role its --scale names) gets
none and is reported as a conflict; the pod selector matches the labels the service's pods carry."""

from __future__ import annotations

import copy

import yaml
from dynamo_api.conversion import load_graph
from dynamo_api.models import DynamoGraphDeployment
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render
from dynamo_operator.render.scaling import pod_selector
from dynamo_operator.render.types import ScalingConflict

from tests.integration.operator.conftest import EXAMPLES


def _raw(name: str) -> dict:
    raw = yaml.safe_load((EXAMPLES / name).read_text())
    raw["metadata"].update(namespace="ns", uid="uid-1")
    return raw


def _opt_in(raw: dict, *services: str) -> dict:
    raw = copy.deepcopy(raw)
    for s in services:
        raw["spec"]["services"][s]["scalingAdapter"] = {"enabled": True}
    return raw


def _render(raw: dict):
    return render(load_graph(raw), OperatorConfig())


def test_no_opt_in_no_adapter():
    rendered = _render(_raw("disagg.yaml"))
    assert rendered.adapters == () and rendered.scaling_conflicts == ()


def test_opted_in_service_gets_an_adapter_owned_by_the_graph():
    rendered = _render(_opt_in(_raw("disagg.yaml"), "decode"))
    (adapter,) = rendered.adapters
    assert adapter["apiVersion"] == "nvidia.com/v1alpha1"
    assert adapter["kind"] == "DynamoGraphDeploymentScalingAdapter"
    assert adapter["metadata"]["name"] == "sglang-disagg-decode"
    assert adapter["metadata"]["namespace"] == "ns"
    assert adapter["spec"] == {"replicas": 1, "dgdRef": {"name": "sglang-disagg", "serviceName": "decode"}}
    (ref,) = adapter["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["uid"], ref["controller"]) == ("DynamoGraphDeployment", "uid-1", True)
    assert adapter["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "dynamo-sglang-operator"
    # the adapter is not among the applied objects: its spec.replicas belongs to HPA/KEDA/kubectl
    assert all(o["kind"] != "DynamoGraphDeploymentScalingAdapter" for o in rendered.objects)


def test_v1beta1_marker_opts_in_and_enabled_false_opts_out():
    gpu = {"spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    beta = {
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "g", "namespace": "ns", "uid": "u"},
        "spec": {
            "components": [
                {"name": "Frontend", "type": "frontend"},
                {"name": "a", "type": "worker", "replicas": 2, "podTemplate": gpu, "scalingAdapter": {}},
                {"name": "b", "type": "worker", "podTemplate": gpu, "scalingAdapter": {"enabled": False}},
            ]
        },
    }
    (adapter,) = _render(beta).adapters
    assert adapter["metadata"]["name"] == "g-a"
    assert adapter["spec"]["replicas"] == 2


def test_planner_wins_over_an_adapter_on_the_services_it_scales():
    raw = _opt_in(_raw("disagg-planner.yaml"), "decode", "prefill", "Frontend")
    rendered = _render(raw)
    assert [a["spec"]["dgdRef"]["serviceName"] for a in rendered.adapters] == ["Frontend"]
    assert rendered.scaling_conflicts == (
        ScalingConflict("decode", "Planner", "sglang-disagg-planner-decode"),
        ScalingConflict("prefill", "Planner", "sglang-disagg-planner-prefill"),
    )


def test_a_planner_limited_to_one_role_leaves_the_other_to_its_adapter():
    raw = _opt_in(_raw("disagg-planner.yaml"), "decode", "prefill")
    raw["spec"]["services"]["Planner"]["extraPodSpec"]["mainContainer"]["args"] += ["--scale", "decode"]
    rendered = _render(raw)
    assert [a["spec"]["dgdRef"]["serviceName"] for a in rendered.adapters] == ["prefill"]
    assert [c.service for c in rendered.scaling_conflicts] == ["decode"]
    # Dynamo's config spelling: mode in an inline --config
    raw = _opt_in(_raw("disagg-planner.yaml"), "decode", "prefill")
    args = raw["spec"]["services"]["Planner"]["extraPodSpec"]["mainContainer"]["args"]
    i = args.index("--config")
    args[i + 1] = args[i + 1].replace('"environment"', '"mode": "prefill", "environment"')
    rendered = _render(raw)
    assert [c.service for c in rendered.scaling_conflicts] == ["prefill"]


def test_pod_selector_selects_the_services_pods():
    rendered = _render(_raw("agg.yaml"))
    dep = next(o for o in rendered.objects if o["metadata"]["name"] == "sglang-agg-decode")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    selector = pod_selector("sglang-agg", "decode")
    pairs = dict(p.split("=", 1) for p in selector.split(","))
    assert pairs.items() <= pod_labels.items()
    assert pairs == dep["spec"]["selector"]["matchLabels"]


def test_render_stays_pure_with_adapters():
    raw = _opt_in(_raw("agg.yaml"), "decode")
    assert _render(raw) == _render(copy.deepcopy(raw))
    assert DynamoGraphDeployment.model_validate(raw).spec.services["decode"].scaling_adapter.enabled


def test_dynamos_deprecated_autoscaling_field_points_to_the_adapter():
    raw = _raw("agg.yaml")
    raw["spec"]["services"]["decode"]["autoscaling"] = {"enabled": True, "minReplicas": 1, "maxReplicas": 3}
    (notice,) = [n for n in _render(raw).notices if n.reason == "IgnoredFields"]
    assert "set scalingAdapter: {enabled: true} and aim an HPA or KEDA at its adapter" in notice.message
