"""The validating webhook's protocol (AdmissionReview v1) and registration, pure: a graph that cannot run is
refused with the request's uid, a 422 and every problem's field and fix; warnings are returned and the
graph allowed; deletes, edits that leave spec alone and graphs being deleted are allowed unjudged; a bad
body is answered with a 400 that says what was expected; the configuration sends CREATE and UPDATE of
v1beta1 graphs (v1alpha1 ones converted) of the watched namespaces to /validate with the CA."""

from __future__ import annotations

import base64

from dynamo_operator.config import OperatorConfig
from dynamo_operator.validating_webhook import (
    Verdict,
    admission_review,
    judge,
    validating_webhook_configuration,
)

WORKER = {
    "componentType": "worker",
    "resources": {"limits": {"gpu": "1"}},
    "extraPodSpec": {"mainContainer": {"args": ["--model-path", "m", "--tp", "2"]}},
}
GRAPH = {
    "apiVersion": "nvidia.com/v1alpha1",
    "kind": "DynamoGraphDeployment",
    "metadata": {"name": "g", "namespace": "ns"},
    "spec": {"services": {"Frontend": {"componentType": "frontend"}, "decode": WORKER}},
}


def _request(operation: str, obj: dict | None, old: dict | None = None) -> dict:
    request = {"uid": "r-1", "operation": operation, "namespace": "ns", "object": obj, "oldObject": old}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def _decide(obj: dict) -> Verdict:
    return judge(obj, OperatorConfig())


def test_a_graph_that_cannot_run_is_refused_with_each_field_and_fix():
    response = admission_review(_request("CREATE", GRAPH), _decide)["response"]
    assert (response["uid"], response["allowed"], response["status"]["code"]) == ("r-1", False, 422)
    message = response["status"]["message"]
    assert message.startswith(
        "DynamoGraphDeployment g cannot run: spec.services.decode.extraPodSpec.mainContainer"
    )
    assert "set --tp to 1 or resources.limits.gpu to 2" in message


def test_warnings_are_returned_and_the_graph_allowed():
    ok = {
        **GRAPH,
        "spec": {
            "services": {
                **GRAPH["spec"]["services"],
                "decode": {**WORKER, "resources": {"limits": {"gpu": "4"}}},
            }
        },
    }
    response = admission_review(_request("UPDATE", ok, GRAPH), _decide)["response"]
    assert response["allowed"] is True and "status" not in response
    assert response["warnings"] == [
        "Service 'decode' runs --tp 2 (engine needs 2 GPUs) on 1 pod(s) x 4 GPU(s) = 4; set --tp to 4, or "
        "resources.limits.gpu so that pods x gpu = 2."
    ]


def test_schema_level_errors_are_refused_too():
    bad = {
        **GRAPH,
        "apiVersion": "nvidia.com/v1beta1",
        "spec": {"components": [{"name": "a", "replicas": -1}]},
    }
    response = admission_review(_request("CREATE", bad), _decide)["response"]
    assert response["allowed"] is False and "spec.components.0.replicas" in response["status"]["message"]


def test_what_is_not_judged():
    calls: list[dict] = []

    def decide(obj: dict) -> Verdict:
        calls.append(obj)
        return Verdict(["nope"])

    deleting = {**GRAPH, "metadata": {**GRAPH["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    relabelled = {**GRAPH, "metadata": {**GRAPH["metadata"], "labels": {"team": "a"}}}
    for body in (
        _request("DELETE", None, GRAPH),
        _request("UPDATE", deleting, GRAPH),
        _request("UPDATE", relabelled, GRAPH),
    ):
        assert admission_review(body, decide)["response"] == {"uid": "r-1", "allowed": True}
    assert calls == []
    answer = admission_review({"kind": "nothing"}, decide)["response"]
    assert answer["allowed"] is False and "expected an AdmissionReview" in answer["status"]["message"]


def test_configuration_sends_v1beta1_graphs_and_models_of_the_watched_namespaces():
    config = validating_webhook_configuration(
        "op", {"url": "https://127.0.0.1:9443/validate"}, b"PEM", "Ignore", ("b", "a")
    )
    (hook,) = config["webhooks"]
    assert hook["clientConfig"] == {
        "url": "https://127.0.0.1:9443/validate",
        "caBundle": base64.b64encode(b"PEM").decode(),
    }
    assert hook["rules"] == [
        {
            "apiGroups": ["nvidia.com"],
            "apiVersions": ["v1beta1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["dynamographdeployments"],
            "scope": "Namespaced",
        },
        {
            "apiGroups": ["nvidia.com"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["dynamomodels"],
            "scope": "Namespaced",
        },
    ]
    assert (hook["matchPolicy"], hook["failurePolicy"], hook["sideEffects"]) == (
        "Equivalent",
        "Ignore",
        "None",
    )
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["a", "b"]
    everywhere = validating_webhook_configuration("op", {"service": {"name": "s"}}, b"PEM", "Fail")
    assert everywhere["webhooks"][0]["namespaceSelector"] == {}


def _model(**spec: object) -> dict:
    body = {"modelName": "support", "baseModelName": "m", "modelType": "lora", **spec}
    meta = {"name": "a"}
    return {"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoModel", "metadata": meta, "spec": body}


def test_a_dynamo_model_without_its_source_or_with_a_bad_type_is_refused_with_the_fix():
    response = admission_review(_request("CREATE", _model()), _decide)["response"]
    assert (response["allowed"], response["status"]["code"]) == (False, 422)
    assert response["status"]["message"].startswith("DynamoModel a cannot run: spec.source.uri: a lora model")
    bad_type = admission_review(_request("CREATE", _model(modelType="qlora")), _decide)["response"]
    assert not bad_type["allowed"] and "spec.modelType" in bad_type["status"]["message"]


def test_a_dynamo_model_with_a_relative_file_source_is_stored_with_a_warning():
    response = admission_review(_request("CREATE", _model(source={"uri": "file://adapters/a"})), _decide)
    answer = response["response"]
    assert answer["allowed"] is True
    (warning,) = answer["warnings"]
    assert warning.startswith("spec.source.uri: file://adapters/a is relative") and "dynamo-run" in warning
    ok = admission_review(_request("CREATE", _model(source={"uri": "hf://org/a"})), _decide)["response"]
    assert ok["allowed"] is True and "warnings" not in ok
