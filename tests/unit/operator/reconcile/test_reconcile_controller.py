"""The controller's pure helpers: conditions for invalid specs, warnings and transport, validation
errors as problems, and the status merge patch (removed services are deleted, equal status is not
rewritten)."""

import pytest
from dynamo_api.models import DynamoGraphDeployment
from dynamo_operator.reconcile.controller import (
    invalid_condition,
    lost_readiness,
    problems_from_validation,
    ready_condition,
    status_patch,
    transport_condition,
    warnings_condition,
)
from dynamo_operator.reconcile.status import ServiceCounts
from dynamo_operator.render.types import Notice, Problem
from pydantic import ValidationError


def test_invalid_condition_names_fields_and_uses_the_single_reason():
    one = invalid_condition(
        (Problem("spec.services.decode.resources.limits.gpu", "MissingGpuLimit", "set it"),)
    )
    assert (one.status, one.reason) == ("False", "MissingGpuLimit")
    assert "spec.services.decode.resources.limits.gpu: set it" in one.message
    two = invalid_condition((Problem("a", "X", "x"), Problem("b", "Y", "y")))
    assert two.reason == "InvalidSpec" and "a: x; b: y" in two.message


def test_warnings_and_transport_conditions():
    notices = (
        Notice("TpMismatch", "decode: --tp 4 but 2 nodes x 4 GPUs = 8", "decode", warning=True),
        Notice("TcpTransport", "prefill/decode: NIXL over TCP", "decode"),
        Notice("IgnoredFields", "autoscaling is ignored"),
    )
    w = warnings_condition(notices)
    assert (w.type, w.status, w.reason) == ("SpecWarnings", "True", "TpMismatch")
    assert warnings_condition(notices[1:]).status == "False"
    t = transport_condition(notices)
    assert t is not None and (t.type, t.reason) == ("Transport", "TcpTransport")
    assert transport_condition(notices[2:]) is None
    mixed = transport_condition((Notice("TcpTransport", "a"), Notice("RdmaTransport", "b")))
    assert mixed is not None and mixed.reason == "MixedTransport"


def test_problems_from_validation_name_the_path():
    with pytest.raises(ValidationError) as err:
        DynamoGraphDeployment.model_validate(
            {"metadata": {"name": "g"}, "spec": {"services": {"decode": {"replicas": -1}}}}
        )
    problems = problems_from_validation(err.value)
    assert problems[0].field == "spec.services.decode.replicas"
    assert problems[0].reason == "InvalidField"
    cond = invalid_condition(problems)
    assert cond.message.count("spec.services.decode.replicas") == 1, "the path is named once"
    assert "(got -1); set a valid value" in cond.message


def test_ready_condition_points_at_the_graph_pods():
    counts = {"decode": ServiceCounts("Deployment", 1, 0, 0, 1)}
    cond = ready_condition(counts, "g")
    assert "kubectl get pods -l nvidia.com/dynamo-graph-deployment-name=g" in cond.message


def test_status_patch():
    current = {"state": "pending", "services": {"a": {"replicas": 1}, "gone": {"replicas": 1}}}
    new = {"state": "successful", "services": {"a": {"replicas": 1}}}
    assert status_patch(current, new) == {
        "status": {"state": "successful", "services": {"a": {"replicas": 1}, "gone": None}}
    }
    assert status_patch({**new, "extra": 1}, new) is None


def test_losing_readiness_is_worth_a_warning_once():
    """Ready True -> False (a pod crashed, a node went away) posts a Warning; staying False does not."""
    waiting = ready_condition({"decode": ServiceCounts("Deployment", 1, 0, 0, 1)}, "g")
    was_ready = [{"type": "Ready", "status": "True", "reason": "AllServicesReady", "message": "m"}]
    assert lost_readiness(was_ready, waiting)
    assert not lost_readiness([{"type": "Ready", "status": "False"}], waiting)
    assert not lost_readiness([], waiting)
    assert not lost_readiness(was_ready, ready_condition({}, "g"))


def test_problems_from_validation_never_quote_an_env_value():
    secret = "hf_do_not_print_me"
    with pytest.raises(ValidationError) as err:
        DynamoGraphDeployment.model_validate(
            {
                "metadata": {"name": "g"},
                "spec": {
                    "services": {
                        "decode": {
                            "envs": [{"value": secret}],
                            "extraPodSpec": {"mainContainer": {"env": [{"value": secret}]}},
                        }
                    }
                },
            }
        )
    cond = invalid_condition(problems_from_validation(err.value))
    assert secret not in cond.message
    assert "spec.services.decode.envs.0.name" in cond.message and "not shown" in cond.message
