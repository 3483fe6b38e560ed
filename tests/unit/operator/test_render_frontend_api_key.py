"""A frontend's API key comes from a Secret, never from a literal the operator writes: the operator's
--frontend-api-key-secret (the chart's frontend.apiKey) gives every frontend pod DYN_API_KEY from a
secretKeyRef, and no worker; a graph that sets DYN_API_KEY on its frontend itself (v1alpha1 envs with
valueFrom, envFromSecret; v1beta1 podTemplate env) keeps its own."""

from __future__ import annotations

from typing import Any

from dynamo_api.conversion import load_graph
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render

CONFIG = OperatorConfig(frontend_api_key_secret="frontend-api-key")
WORKER = {
    "componentType": "worker",
    "resources": {"limits": {"gpu": "1"}},
    "extraPodSpec": {"mainContainer": {"args": ["--model-path", "m"]}},
}
GRAPH_KEY = {"name": "DYN_API_KEY", "valueFrom": {"secretKeyRef": {"name": "team-key", "key": "key"}}}


def _containers(graph: dict[str, Any], config: OperatorConfig) -> dict[str, dict[str, Any]]:
    rendered = render(load_graph(graph), config)
    assert rendered.problems == ()
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["containers"][0]
        for o in rendered.objects
        if o["kind"] == "Deployment"
    }


def _v1alpha1(frontend: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "g", "namespace": "ns", "uid": "u-1"},
        "spec": {"services": {"Frontend": {"componentType": "frontend", **frontend}, "decode": WORKER}},
    }


def _api_key_env(container: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in container["env"] if e["name"] == "DYN_API_KEY"]


def test_operator_secret_reaches_every_frontend_and_no_worker():
    containers = _containers(_v1alpha1({}), CONFIG)
    assert _api_key_env(containers["g-frontend"]) == [
        {"name": "DYN_API_KEY", "valueFrom": {"secretKeyRef": {"name": "frontend-api-key", "key": "api-key"}}}
    ]
    assert _api_key_env(containers["g-decode"]) == []
    assert _api_key_env(_containers(_v1alpha1({}), OperatorConfig())["g-frontend"]) == []


def test_the_graphs_own_secret_wins():
    for config in (CONFIG, OperatorConfig()):
        containers = _containers(_v1alpha1({"envs": [GRAPH_KEY]}), config)
        assert _api_key_env(containers["g-frontend"]) == [GRAPH_KEY]
    from_secret = _containers(_v1alpha1({"envFromSecret": "team-env"}), OperatorConfig())["g-frontend"]
    assert from_secret["envFrom"] == [{"secretRef": {"name": "team-env"}}]


def test_v1beta1_frontend_env_from_a_secret():
    graph = {
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "g", "namespace": "ns", "uid": "u-1"},
        "spec": {
            "components": [
                {
                    "name": "Frontend",
                    "type": "frontend",
                    "podTemplate": {"spec": {"containers": [{"name": "main", "env": [GRAPH_KEY]}]}},
                },
            ]
        },
    }
    assert _api_key_env(_containers(graph, CONFIG)["g-frontend"]) == [GRAPH_KEY]
