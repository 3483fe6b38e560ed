"""dynamo_api.validation: every invalid graph is answered with a Problem naming the field, a
one-word reason and the fix; render then renders nothing; valid Dynamo-shaped graphs pass.
(dynamo-run reports the same Problems: tests/unit/local/test_manifest.py.)"""

from __future__ import annotations

import pytest
from dynamo_api.models import DynamoGraphDeployment
from dynamo_api.validation import Problem, validate
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render

FRONTEND = {"componentType": "frontend"}


def _worker(args: list[str] | None = None, **overrides) -> dict:
    service = {
        "componentType": "worker",
        "resources": {"limits": {"gpu": "1"}},
        "extraPodSpec": {
            "mainContainer": {"command": ["python3", "-m", "dynamo.sglang"], "args": args or []}
        },
    }
    service.update(overrides)
    return service


def _problems(services: dict, name: str = "g", **spec) -> list[tuple[str, str]]:
    body = {"metadata": {"name": name, "namespace": "ns"}, "spec": {"services": services, **spec}}
    problems = validate(DynamoGraphDeployment.model_validate(body))
    for problem in problems:
        assert problem.reason.isalpha() and problem.reason[0].isupper()
        assert problem.message.endswith(".")
    return [(p.field, p.reason) for p in problems]


def _validate(body: dict) -> tuple[Problem, ...]:
    return validate(DynamoGraphDeployment.model_validate(body))


def test_valid_graph_has_no_problems():
    assert _problems({"Frontend": FRONTEND, "decode": _worker()}) == []


F = {"Frontend": FRONTEND}
D = "spec.services.decode"
ARGS = f"{D}.extraPodSpec.mainContainer.args"
PREFILL = ["--disaggregation-mode", "prefill"]
BACKEND = ("spec.backendFramework", "UnsupportedBackend")
CASES = [
    (F | {"decode": _worker()}, {"backendFramework": "vllm"}, BACKEND),
    ({}, {}, ("spec.services", "NoServices")),
    ({"decode": _worker()}, {}, ("spec.services", "NoFrontend")),
    (F | {"decode": {"replicas": 1}}, {}, (f"{D}.componentType", "MissingComponentType")),
    (F | {"decode": _worker(resources={})}, {}, (f"{D}.resources.limits.gpu", "MissingGpuLimit")),
    (
        F | {"decode": _worker(resources={"limits": {"gpu": "half"}})},
        {},
        (f"{D}.resources.limits.gpu", "InvalidGpuCount"),
    ),
    (
        F | {"decode": _worker(resources={"limits": {"gpu": "2"}, "requests": {"gpu": "1"}})},
        {},
        (f"{D}.resources.requests.gpu", "GpuRequestMismatch"),
    ),
    (
        {"Frontend": FRONTEND | {"multinode": {"nodeCount": 2}}, "decode": _worker()},
        {},
        ("spec.services.Frontend.multinode", "MultinodeNotSupported"),
    ),
    (F | {"decode": _worker(), "my_worker": _worker()}, {}, ("spec.services.my_worker", "InvalidName")),
    (F | {"decode": _worker(), "Decode": _worker()}, {}, (D, "DuplicateName")),
    (F | {"decode": _worker(PREFILL, subComponentType="decode")}, {}, (ARGS, "RoleMismatch")),
    (F | {"decode": _worker(["--tp", "x"])}, {}, (ARGS, "InvalidFlag")),
    (
        F | {"planner": {"componentType": "planner"}, "decode": _worker()},
        {},
        ("spec.services.planner.extraPodSpec.mainContainer.command", "MissingCommand"),
    ),
    (
        F | {"decode": _worker(volumeMounts=[{"name": "nope", "mountPoint": "/m"}])},
        {},
        (f"{D}.volumeMounts[0].name", "UnknownVolume"),
    ),
    (
        F | {"decode": _worker(volumeMounts=[{"name": "m"}])},
        {"pvcs": [{"name": "m"}]},
        (f"{D}.volumeMounts[0].mountPoint", "MissingMountPoint"),
    ),
    (F | {"decode": _worker()}, {"pvcs": [{"name": "m", "create": True}]}, ("spec.pvcs[0]", "IncompletePvc")),
    (
        F | {"decode": _worker(annotations={"nvidia.com/rdma": "yes please"})},
        {},
        (f"{D}.annotations.nvidia.com/rdma", "InvalidAnnotation"),
    ),
    (F | {"prefill": _worker(PREFILL)}, {}, ("spec.services.prefill", "MissingDecode")),
    (F | {"decode": _worker(subComponentType="decode")}, {}, (D, "MissingPrefill")),
]


@pytest.mark.parametrize(("services", "spec", "expected"), CASES, ids=[c[2][1] for c in CASES])
def test_problem(services, spec, expected):
    assert expected in _problems(services, **spec)


def test_invalid_graph_name():
    assert ("metadata.name", "InvalidName") in _problems(
        {"Frontend": FRONTEND, "decode": _worker()}, name="1.g"
    )


def test_invalid_module_annotation():
    body = {
        "metadata": {"name": "g", "annotations": {"nvidia.com/dynamo-worker-module": "dynamo.vllm"}},
        "spec": {"services": {"Frontend": FRONTEND, "decode": _worker()}},
    }
    (problem,) = _validate(body)
    assert problem == Problem(
        "metadata.annotations.nvidia.com/dynamo-worker-module",
        "InvalidAnnotation",
        "Annotation nvidia.com/dynamo-worker-module='dynamo.vllm' must name one of "
        "dynamo_worker.sglang, dynamo_worker.mocker.",
    )


def _disagg(prefill: list[str], decode: list[str]) -> dict:
    return {
        "Frontend": FRONTEND,
        "prefill": _worker(["--disaggregation-mode", "prefill", *prefill]),
        "decode": _worker(["--disaggregation-mode", "decode", *decode]),
    }


def test_page_size_mismatch():
    body = {
        "metadata": {"name": "g"},
        "spec": {"services": _disagg(["--page-size", "16"], ["--page-size", "32"])},
    }
    (problem,) = _validate(body)
    assert problem == Problem(
        "spec.services.decode.extraPodSpec.mainContainer.args",
        "PageSizeMismatch",
        "Prefill 'prefill' runs --page-size 16 but decode 'decode' runs --page-size 32; the KV cache they "
        "hand over must have one layout: set the same value on both.",
    )


def test_transfer_backend_mismatch_counts_sglang_default():
    problems = _problems(_disagg(["--disaggregation-transfer-backend", "nixl"], []))
    assert problems == [("spec.services.decode.extraPodSpec.mainContainer.args", "TransferBackendMismatch")]
    assert _problems(_disagg(["--disaggregation-transfer-backend", "mooncake"], [])) == []


def test_dynamo_disagg_without_sub_component_type_uses_the_flag():
    services = _disagg(["--page-size", "16"], ["--page-size", "16"])
    assert _problems(services) == []


def test_render_refuses_an_invalid_graph_with_validates_problems_and_renders_nothing():
    body = {
        "metadata": {"name": "g"},
        "spec": {"services": _disagg(["--page-size", "16"], ["--page-size", "32"]) | {"x": {"replicas": 1}}},
    }
    dgd = DynamoGraphDeployment.model_validate(body)
    rendered = render(dgd, OperatorConfig())
    assert rendered.problems == validate(dgd) and len(rendered.problems) == 2
    assert rendered.objects == () and rendered.services == {} and rendered.notices == ()
