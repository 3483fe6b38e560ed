"""A DynamoModel's endpoints and conditions, from observed pods and answers: only serving pods of the
target services (a multinode group by its leader, never a pod being deleted or not ready), at their
system port; Ready only when every endpoint holds the adapter; a worker's refusal is the condition's
reason with its message (the fix); no graph, or no pod yet, is said so; a base model is Ready once its
workers exist. And the LoRA gate's pods, and a relative file:// source in a cluster."""

from __future__ import annotations

from dynamo_api.dynamo_model import DynamoModel
from dynamo_api.loras import Refusal
from dynamo_api.models import DynamoGraphDeployment
from dynamo_operator.reconcile import model_endpoints as me
from dynamo_operator.render import labels
from dynamo_operator.render.lora_gate import LORA_GATE_CONDITION

TARGETS = {"g": ("decode", "prefill")}


def pod(
    name: str,
    service: str = "decode",
    *,
    graph: str = "g",
    ip: str | None = "10.0.0.5",
    ready: bool = True,
    deleting: bool = False,
    member: bool = False,
    gate: str | None = None,
) -> dict:
    pod_labels = {labels.GRAPH: graph, labels.COMPONENT: service}
    if member:
        pod_labels[labels.MULTINODE_ROLE] = "worker"
    meta: dict = {"name": name, "labels": pod_labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    conditions = [{"type": "ContainersReady", "status": str(ready)}]
    if gate is not None:
        conditions.append({"type": LORA_GATE_CONDITION, "status": gate})
    ports = [{"name": "system", "containerPort": 9090}, {"name": "request", "containerPort": 9100}]
    return {
        "metadata": meta,
        "spec": {
            "containers": [{"name": "main", "ports": ports}],
            "readinessGates": [{"conditionType": LORA_GATE_CONDITION}],
        },
        "status": {"podIP": ip, "conditions": conditions} if ip else {"conditions": conditions},
    }


def model(model_type: str = "lora", uri: str = "file:///adapters/a") -> DynamoModel:
    spec = {"modelName": "a", "baseModelName": "m", "modelType": model_type, "source": {"uri": uri}}
    return DynamoModel.model_validate({"metadata": {"name": "a", "namespace": "ns"}, "spec": spec})


def test_endpoints_are_the_serving_pods_of_the_target_services():
    pods = [
        pod("d-1"),
        pod("p-1", "prefill", ip="fd00::7"),
        pod("f-1", "Frontend"),  # not a target service
        pod("o-1", graph="other"),  # another graph's decode
        pod("d-2", ready=False),
        pod("d-3", deleting=True),
        pod("d-4", ip=None),
        pod("d-0-1", member=True),  # a multinode rank above 0
    ]
    found = me.endpoints(pods, TARGETS)
    assert [(e.pod, e.address, e.service) for e in found] == [
        ("d-1", "http://10.0.0.5:9090", "decode"),
        ("p-1", "http://[fd00::7]:9090", "prefill"),
    ]


def observed(name: str, ready: bool, refusal: Refusal | None = None, unreachable: str | None = None):
    return me.ObservedEndpoint(me.endpoint_of(pod(name)), ready, refusal, unreachable)


def by_type(conds) -> dict:
    return {c.type: (c.status, c.reason, c.message) for c in conds}


def test_ready_only_when_every_endpoint_holds_the_adapter():
    conds = by_type(me.model_conditions(model(), TARGETS, [observed("d-1", True), observed("p-1", True)]))
    assert conds["Ready"][:2] == ("True", "AllEndpointsReady") and "All 2 endpoint(s)" in conds["Ready"][2]
    assert conds["EndpointsReady"][:2] == ("True", "AllEndpointsReady")
    assert (
        conds["ServicesFound"][:2] == ("True", "ServicesFound")
        and "g/decode, g/prefill" in conds["ServicesFound"][2]
    )
    status = me.status_body([observed("d-1", True), observed("p-1", False)])
    assert (status["readyEndpoints"], status["totalEndpoints"]) == (1, 2)
    assert status["endpoints"][1] == {"address": "http://10.0.0.5:9090", "podName": "p-1", "ready": False}
    loading = by_type(me.model_conditions(model(), TARGETS, [observed("d-1", True), observed("p-1", False)]))
    assert loading["Ready"][:2] == ("False", "NotReady")
    assert "1/2 endpoints hold adapter a" in loading["Ready"][2] and "p-1" in loading["Ready"][2]


def test_a_workers_refusal_is_the_reason_and_its_message_the_fix():
    rank = Refusal("RankTooLarge", "the adapter's rank 64 is above --max-lora-rank 16; raise it")
    conds = by_type(
        me.model_conditions(
            model(),
            TARGETS,
            [
                observed("d-1", False, rank),
                observed("p-1", False, rank),
                observed("x-1", False, unreachable="t"),
            ],
        )
    )
    status, reason, message = conds["Ready"]
    assert (status, reason) == ("False", "RankTooLarge")
    assert "0/3 endpoints hold adapter a; d-1, p-1 refused it" in message and "raise it" in message
    unreachable = by_type(
        me.model_conditions(model(), TARGETS, [observed("d-1", False, unreachable="timeout")])
    )
    assert unreachable["Ready"][1] == "NotReady" and "no answer from d-1 (timeout)" in unreachable["Ready"][2]


def test_no_graph_and_no_pod_are_said_so():
    none = by_type(me.model_conditions(model(), {}, []))
    assert none["ServicesFound"][:2] == ("False", "NoServicesFound")
    assert none["Ready"][:2] == ("False", "NoServicesFound") and "spec.baseModelName" in none["Ready"][2]
    assert none["EndpointsReady"][:2] == ("False", "NoEndpoints")
    empty = by_type(me.model_conditions(model(), TARGETS, []))
    assert empty["Ready"][:2] == ("False", "NoEndpoints") and empty["ServicesFound"][0] == "True"


def test_a_base_model_is_ready_once_its_workers_serve():
    conds = by_type(me.model_conditions(model("base"), TARGETS, [observed("d-1", True)]))
    assert conds["Ready"][:2] == ("True", "EndpointsDiscovered")


def test_targets_are_the_graphs_serving_the_base_model():
    def graph(name: str, served: str) -> DynamoGraphDeployment:
        worker = {
            "componentType": "worker",
            "extraPodSpec": {"mainContainer": {"args": ["--served-model-name", served]}},
        }
        return DynamoGraphDeployment.model_validate(
            {"metadata": {"name": name}, "spec": {"services": {"decode": worker}}}
        )

    assert me.targets([graph("g1", "m"), graph("g2", "n"), graph("g3", "m")], "m") == {
        "g1": ("decode",),
        "g3": ("decode",),
    }


def test_the_lora_gate_waits_on_serving_pods_whose_gate_is_closed():
    assert me.waits_for_lora_gate(pod("d-1"))
    assert not me.waits_for_lora_gate(pod("d-1", gate="True"))
    assert not me.waits_for_lora_gate(pod("d-1", ready=False))  # its system port does not answer yet
    assert not me.waits_for_lora_gate(pod("d-1", deleting=True))
    opened = me.gate_condition("2026-01-01T00:00:00Z", ["a", "b"])["status"]["conditions"][0]
    assert (opened["type"], opened["status"], opened["reason"]) == (
        LORA_GATE_CONDITION,
        "True",
        "LorasLoaded",
    )
    assert "a, b" in opened["message"]


def test_a_relative_file_source_cannot_load_in_a_cluster():
    (problem,) = me.cluster_problems(model(uri="file://adapters/a"))
    assert problem.reason == "RelativeSource" and "file:///path" in problem.message
    assert me.cluster_problems(model()) == () and me.cluster_problems(model("base", "file://x")) == ()
    (ready, endpoints) = me.invalid_conditions((problem,))
    assert (ready.type, ready.status, ready.reason) == ("Ready", "False", "RelativeSource")
    assert endpoints.type == "EndpointsReady" and "nothing was loaded" in endpoints.message


def test_events_come_on_transitions_only():
    ready = me.model_conditions(model(), TARGETS, [observed("d-1", True)])[0]
    (event,) = me.model_events([], ready)
    assert (event.type, event.reason) == ("Normal", "EndpointsReady")
    current = [{"type": "Ready", "status": "True", "reason": ready.reason, "message": ready.message}]
    assert me.model_events(current, ready) == []
    rank = Refusal("RankTooLarge", "raise --max-lora-rank")
    refused = me.model_conditions(model(), TARGETS, [observed("d-1", False, rank)])[0]
    (warning,) = me.model_events(current, refused)
    assert (warning.type, warning.reason) == ("Warning", "RankTooLarge") and "raise" in warning.message
    loading = me.model_conditions(model(), TARGETS, [observed("d-1", False)])[0]
    assert me.model_events(current, loading) == []  # loading is no news


def test_a_worker_on_dummy_weights_is_a_permanent_refusal_with_its_fix():
    """A worker under ``--load-format dummy`` answers ``LoraNotSupported``: the condition's reason, the
    worker's message (the flag and the fix) in it and in the Warning Event, and permanent (the LoRA gate
    does not hold a rollout up on it)."""
    why = Refusal(
        "LoraNotSupported",
        "this worker cannot load adapters: ... serve real weights with --load-format auto",
    )
    assert why.permanent
    conds = by_type(me.model_conditions(model(), TARGETS, [observed("d-1", False, why)]))
    status, reason, message = conds["Ready"]
    assert (status, reason) == ("False", "LoraNotSupported")
    assert "d-1 refused it" in message and "--load-format auto" in message
    (warning,) = me.model_events([], me.model_conditions(model(), TARGETS, [observed("d-1", False, why)])[0])
    assert (warning.type, warning.reason) == (
        "Warning",
        "LoraNotSupported",
    ) and "--load-format" in warning.message
