"""A graph with an endpoint picker (componentType epp, NVIDIA Dynamo's shape) renders the picker's
Deployment (python3 -m dynamo_worker.epp, its ports, probes and the frontends it sends to), its Service,
a headless Service per frontend, and GAIE's v1 InferencePool selecting the frontend pods and naming the
picker; its frontends run --router-mode direct; its workers publish KV events when the picker routes on
KV. Without GAIE's CRD the pool is left out with a warning naming the fix."""

from __future__ import annotations

import copy

from dynamo_api import contract
from dynamo_api.conversion import load_graph
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render
from dynamo_operator.render.endpoint_picker import without_pools

from tests.integration.operator.conftest import example

CONFIG = OperatorConfig(group_backend="statefulset")


def _graph(**edit) -> dict:
    graph = example("gateway.yaml")
    graph["metadata"].update(namespace="ns", uid="u-1")
    for service, args in edit.items():
        graph["spec"]["services"][service].setdefault("extraPodSpec", {}).setdefault("mainContainer", {})
        graph["spec"]["services"][service]["extraPodSpec"]["mainContainer"]["args"] = args
    return graph


def _objects(graph: dict) -> dict[tuple[str, str], dict]:
    rendered = render(load_graph(graph), CONFIG)
    assert rendered.problems == ()
    return {(o["kind"], o["metadata"]["name"]): o for o in rendered.objects}


def _main(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]["containers"][0]


def test_the_picker_its_service_the_frontends_pods_and_the_pool():
    objs = _objects(_graph())
    picker = _main(objs[("Deployment", "sglang-gateway-epp")])
    assert picker["command"] == ["python3", "-m", "dynamo_worker.epp"]
    assert picker["args"] == ["--router-mode", "kv"]
    assert picker["image"] == CONFIG.frontend_image
    env = {e["name"]: e.get("value") for e in picker["env"]}
    assert env[contract.ENV_EPP_FRONTENDS] == "sglang-gateway-frontend-pods:8000"
    assert env[contract.ENV_NAMESPACE] == "ns-sglang-gateway" and env[contract.ENV_NATS_SERVER]
    assert [(p["name"], p["containerPort"]) for p in picker["ports"]] == [("grpc", 9002), ("system", 9090)]
    assert picker["readinessProbe"]["httpGet"] == {"path": "/health", "port": "system"}

    service = objs[("Service", "sglang-gateway-epp")]["spec"]
    assert service["selector"] == {
        "nvidia.com/dynamo-graph-deployment-name": "sglang-gateway",
        "nvidia.com/dynamo-component": "epp",
    }
    assert [(p["name"], p["port"], p.get("appProtocol")) for p in service["ports"]] == [
        ("grpc", 9002, "kubernetes.io/h2c"),
        ("system", 9090, None),
    ]
    pods = objs[("Service", "sglang-gateway-frontend-pods")]["spec"]
    assert pods["clusterIP"] == "None" and pods["ports"][0]["port"] == 8000
    assert pods["selector"]["nvidia.com/dynamo-component"] == "Frontend"

    pool = objs[("InferencePool", "sglang-gateway-pool")]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"] == {
        "selector": {
            "matchLabels": {
                "nvidia.com/dynamo-graph-deployment-name": "sglang-gateway",
                "nvidia.com/dynamo-component-type": "frontend",
            }
        },
        "targetPorts": [{"number": 8000}],
        "endpointPickerRef": {
            "kind": "Service",
            "name": "sglang-gateway-epp",
            "port": {"number": 9002},
            "failureMode": "FailClose",
        },
    }
    # owned by the graph like every child, so deleting the graph deletes them
    for key in (("InferencePool", "sglang-gateway-pool"), ("Service", "sglang-gateway-frontend-pods")):
        (owner,) = objs[key]["metadata"]["ownerReferences"]
        assert (owner["name"], owner["uid"], owner["controller"]) == ("sglang-gateway", "u-1", True)
    # the pool's selector matches the frontend pods, and only them
    selector = pool["spec"]["selector"]["matchLabels"]
    for (kind, name), obj in objs.items():
        if kind == "Deployment":
            pod_labels = obj["spec"]["template"]["metadata"]["labels"]
            selected = selector.items() <= pod_labels.items()
            assert selected == (name == "sglang-gateway-frontend"), name


def test_frontends_run_direct_and_workers_publish_kv_events_for_the_picker():
    objs = _objects(_graph())
    assert _main(objs[("Deployment", "sglang-gateway-frontend")])["args"] == ["--router-mode", "direct"]
    assert "--kv-events-config" in _main(objs[("Deployment", "sglang-gateway-decode")])["args"]
    # a picker that does not route on KV: no publisher wired
    objs = _objects(_graph(epp=["--router-mode", "round-robin"]))
    assert "--kv-events-config" not in _main(objs[("Deployment", "sglang-gateway-decode")])["args"]


def test_a_frontend_router_mode_behind_the_picker_is_overridden_with_a_warning():
    rendered = render(load_graph(_graph(Frontend=["--router-mode", "kv"])), CONFIG)
    (notice,) = [n for n in rendered.notices if n.reason == "RouterModeOverridden"]
    assert notice.warning and "set --router-mode on the picker instead" in notice.message
    objs = {(o["kind"], o["metadata"]["name"]): o for o in rendered.objects}
    assert _main(objs[("Deployment", "sglang-gateway-frontend")])["args"] == ["--router-mode", "direct"]


def test_one_picker_per_graph():
    graph = _graph()
    graph["spec"]["services"]["epp2"] = copy.deepcopy(graph["spec"]["services"]["epp"])
    (problem,) = render(load_graph(graph), CONFIG).problems
    assert problem.reason == "MultipleEpp" and "epp, epp2" in problem.message


def test_without_the_crd_the_pool_is_left_out_with_the_fix():
    rendered = render(load_graph(_graph()), CONFIG)
    dropped = without_pools(rendered)
    assert [o["kind"] for o in dropped.objects] == [o["kind"] for o in rendered.objects][:-1]
    (notice,) = dropped.notices
    assert notice.reason == "InferencePoolCrdMissing" and notice.warning
    assert "inferenceExtension.installCRD=true" in notice.message and "manifests.yaml" in notice.message
    assert without_pools(dropped) == dropped  # nothing more to drop, nothing said twice
