"""Conditions keep lastTransitionTime while their status is unchanged; changes are detected on what a
person reads (status, reason, message). The graph's conditions for invalid specs, warnings and
transport, and validation errors as problems (never quoting an env value)."""

import pytest
from dynamo_api.models import DynamoGraphDeployment
from dynamo_operator.reconcile.conditions import (
    Cond,
    changed,
    invalid_condition,
    merge,
    problems_from_validation,
    transport_condition,
    warnings_condition,
)
from dynamo_operator.render.types import Notice, Problem
from pydantic import ValidationError


def test_merge_keeps_transition_time_when_status_unchanged():
    current = [
        {"type": "Ready", "status": "False", "reason": "A", "message": "m", "lastTransitionTime": "t0"}
    ]
    out = merge(current, [Cond("Ready", "False", "B", "other")], now="t1", generation=3)
    assert out == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "B",
            "message": "other",
            "lastTransitionTime": "t0",
            "observedGeneration": 3,
        }
    ]


def test_merge_sets_transition_time_on_status_change_and_drops_unwanted_types():
    current = [
        {"type": "Ready", "status": "False", "reason": "A", "message": "m", "lastTransitionTime": "t0"},
        {"type": "Old", "status": "True", "reason": "X", "message": "x", "lastTransitionTime": "t0"},
    ]
    out = merge(current, [Cond("Ready", "True", "Ok", "fine")], now="t1", generation=None)
    assert out == [
        {"type": "Ready", "status": "True", "reason": "Ok", "message": "fine", "lastTransitionTime": "t1"}
    ]


def test_changed():
    current = [{"type": "Ready", "status": "True", "reason": "Ok", "message": "fine"}]
    assert not changed(current, Cond("Ready", "True", "Ok", "fine"))
    assert changed(current, Cond("Ready", "True", "Ok", "finer"))
    assert changed(current, Cond("Other", "True", "Ok", "fine"))


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
