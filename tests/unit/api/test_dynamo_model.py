"""DynamoModel in NVIDIA Dynamo's shape: Dynamo's own manifests parse; a LoRA model without its files,
with an unsupported source, or with a name requests could not tell apart is refused with the fix; the
CRD (generated, committed) has Dynamo's names, printer columns and the API server's rule for lora
without a source."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from dynamo_api import crdgen
from dynamo_api.dynamo_model import DynamoModel, is_relative_file, problems

REPO = Path(__file__).resolve().parents[3]

# From NVIDIA Dynamo's "Managing Models with DynamoModel" guide.
DYNAMO_LORA = """
apiVersion: nvidia.com/v1alpha1
kind: DynamoModel
metadata:
  name: my-lora
  namespace: dynamo-system
spec:
  modelName: my-custom-lora
  baseModelName: Qwen/Qwen3-0.6B
  modelType: lora
  source:
    uri: s3://my-bucket/loras/my-lora
"""
DYNAMO_BASE = """
apiVersion: nvidia.com/v1alpha1
kind: DynamoModel
metadata:
  name: qwen-base
spec:
  modelName: Qwen/Qwen3-0.6B
  baseModelName: Qwen/Qwen3-0.6B
  modelType: base
"""


def model(**spec: object) -> DynamoModel:
    body = {"modelName": "support", "baseModelName": "Qwen/Qwen3-0.6B", "modelType": "lora", **spec}
    return DynamoModel.model_validate({"metadata": {"name": "m"}, "spec": body})


def test_dynamos_manifests_parse_and_pass():
    lora = DynamoModel.model_validate(yaml.safe_load(DYNAMO_LORA))
    assert (lora.spec.model_name, lora.spec.base_model_name, lora.spec.loads_adapter) == (
        "my-custom-lora",
        "Qwen/Qwen3-0.6B",
        True,
    )
    assert lora.spec.source is not None and lora.spec.source.uri == "s3://my-bucket/loras/my-lora"
    base = DynamoModel.model_validate(yaml.safe_load(DYNAMO_BASE))
    assert not base.spec.loads_adapter
    assert problems(lora) == () and problems(base) == ()
    assert (
        DynamoModel.model_validate(
            {"metadata": {"name": "m"}, "spec": {"modelName": "a", "baseModelName": "b"}}
        ).spec.model_type
        == "base"
    )


@pytest.mark.parametrize(
    ("spec", "reason", "fix"),
    [
        ({}, "MissingSource", "set spec.source.uri"),
        ({"modelType": "adapter"}, "MissingSource", "set spec.source.uri"),
        ({"source": {"uri": "/models/loras/a"}}, "InvalidSource", "file:///path"),
        ({"source": {"uri": "https://example.com/a"}}, "InvalidSource", "hf://org/repo"),
        ({"modelName": "base:support", "source": {"uri": "hf://org/a"}}, "InvalidName", "without ':'"),
        (
            {"modelName": "Qwen/Qwen3-0.6B", "source": {"uri": "hf://org/a"}},
            "InvalidName",
            "a name of its own",
        ),
    ],
)
def test_what_cannot_load_is_a_problem_naming_the_fix(spec, reason, fix):
    (problem,) = problems(model(**spec))
    assert problem.reason == reason and fix in problem.message


def test_a_base_model_needs_no_source_and_a_bad_model_type_is_refused():
    assert problems(model(modelType="base")) == ()
    with pytest.raises(ValueError, match="modelType"):
        model(modelType="qlora")


def test_relative_file_sources_are_recognized():
    assert is_relative_file("file://adapters/a") and is_relative_file("file://./a")
    assert not is_relative_file("file:///abs/a") and not is_relative_file("hf://org/a")


def test_the_crd_has_dynamos_names_columns_and_the_source_rule():
    crd = crdgen.build_model_crd()
    assert crd["metadata"]["name"] == "dynamomodels.nvidia.com"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("DynamoModel", "dynamomodels", ["dm"])
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["storage"], version["subresources"]) == (
        "v1alpha1",
        True,
        {"status": {}},
    )
    shown = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert shown == ["Total", "Ready", "Age"]
    schema = version["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    assert spec["required"] == ["modelName", "baseModelName"]
    assert spec["properties"]["modelType"]["enum"] == ["base", "lora", "adapter"]
    assert "self.modelType == 'base'" in spec["x-kubernetes-validations"][0]["rule"]
    status = schema["properties"]["status"]["properties"]
    assert set(status) >= {
        "endpoints",
        "readyEndpoints",
        "totalEndpoints",
        "conditions",
        "observedGeneration",
    }
    assert set(status["endpoints"]["items"]["properties"]) == {"address", "podName", "ready"}


def test_the_committed_crd_is_fresh_in_crds_and_the_chart():
    text = crdgen.render_model_crd_yaml()
    assert (REPO / "crds" / crdgen.MODEL_CRD_FILENAME).read_text() == text, "run `make crds`"
    assert (REPO / "charts" / "dynamo-operator" / "crds" / crdgen.MODEL_CRD_FILENAME).read_text() == text
