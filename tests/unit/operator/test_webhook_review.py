"""The conversion webhook's protocol (ConversionReview v1) and how it points the CRD at itself: objects
come back in the desired version with the request's uid; a bad request is answered with a Failure that
says why; the CRD patch sets the address and CA and clears the other kind of address."""

from __future__ import annotations

import base64

from dynamo_operator.webhook import crd_conversion_patch, review

GRAPH = {
    "apiVersion": "nvidia.com/v1alpha1",
    "kind": "DynamoGraphDeployment",
    "metadata": {"name": "g", "namespace": "ns", "uid": "u", "resourceVersion": "7"},
    "spec": {"services": {"Frontend": {"componentType": "frontend", "replicas": 1}}},
}


def _request(desired: str, *objects: dict) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": "r-1", "desiredAPIVersion": desired, "objects": list(objects)},
    }


def test_objects_come_back_converted_with_the_uid_and_their_metadata():
    answer = review(_request("nvidia.com/v1beta1", GRAPH, GRAPH))
    response = answer["response"]
    assert (answer["kind"], response["uid"], response["result"]) == (
        "ConversionReview",
        "r-1",
        {"status": "Success"},
    )
    assert [o["apiVersion"] for o in response["convertedObjects"]] == ["nvidia.com/v1beta1"] * 2
    converted = response["convertedObjects"][0]
    assert converted["metadata"] == GRAPH["metadata"]  # the API server refuses changed uid/resourceVersion
    assert converted["spec"]["components"] == [
        {
            "name": "Frontend",
            "type": "frontend",
            "replicas": 1,
            "podTemplate": {"spec": {"containers": [{"name": "main"}]}},
        }
    ]


def test_unserved_version_is_a_failure_that_names_it():
    response = review(_request("nvidia.com/v9", GRAPH))["response"]
    assert response["result"]["status"] == "Failure"
    assert "nvidia.com/v9 is not served" in response["result"]["message"]
    assert "convertedObjects" not in response


def test_a_body_without_request_is_a_failure():
    response = review({"kind": "ConversionReview"})["response"]
    assert response["result"]["status"] == "Failure" and "ConversionReview" in response["result"]["message"]


def test_crd_patch_sets_address_and_ca_and_clears_the_other_address():
    patch = crd_conversion_patch({"url": "https://127.0.0.1:9443/convert"}, b"PEM")
    webhook = patch["spec"]["conversion"]["webhook"]
    assert patch["spec"]["conversion"]["strategy"] == "Webhook"
    assert webhook["conversionReviewVersions"] == ["v1"]
    assert webhook["clientConfig"] == {
        "url": "https://127.0.0.1:9443/convert",
        "service": None,  # merge patch: removes a Service address left by the chart's CRD
        "caBundle": base64.b64encode(b"PEM").decode(),
    }
