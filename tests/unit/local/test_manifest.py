"""dynamo_worker.local.manifest: a manifest is read with dynamo_api's manifest models and judged by the
operator's own validation, so what the operator refuses is refused here with the same Problems (field
paths, reasons and messages) before anything starts."""

from __future__ import annotations

import pytest
import yaml
from dynamo_api.models import DynamoGraphDeployment
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render
from dynamo_worker.local.manifest import ManifestError, load_manifest, parse_manifest
from pydantic import ValidationError

GRAPH = """
apiVersion: nvidia.com/v1alpha1
kind: DynamoGraphDeployment
metadata: {name: g}
spec:
  services:
    Frontend: {componentType: frontend}
    prefill:
      componentType: worker
      resources: {limits: {gpu: "1"}}
      extraPodSpec:
        mainContainer:
          command: [python3, -m, dynamo.sglang]
          args: [--model-path, m, --disaggregation-mode, prefill, --page-size, "16"]
    decode:
      componentType: worker
      resources: {limits: {gpu: "1"}}
      extraPodSpec:
        mainContainer:
          command: [sh, -c]
          args: ["python3 -m dynamo.sglang --model-path m --disaggregation-mode decode --page-size 16"]
"""

BAD = """
apiVersion: nvidia.com/v1alpha1
kind: DynamoGraphDeployment
metadata: {name: g}
spec:
  services:
    decode: {componentType: worker, replicas: -1}
    other: {componentType: sidecar}
"""


def test_validation_errors_are_the_operators_with_their_field_paths():
    with pytest.raises(ValidationError) as expected:
        DynamoGraphDeployment.model_validate(yaml.safe_load(BAD))
    with pytest.raises(ManifestError) as got:
        parse_manifest(BAD, "bad.yaml")
    text = str(got.value)
    assert text.startswith("bad.yaml is not a valid DynamoGraphDeployment:")
    assert "spec.services.decode.replicas: Input should be greater than or equal to 0" in text
    for err in expected.value.errors():
        assert err["msg"] in text


def test_other_documents_are_skipped_and_one_graph_is_required():
    doc = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n---\n"
    graph = GRAPH
    assert parse_manifest(doc + graph).name == "g"
    with pytest.raises(ManifestError, match=r"holds 0 DynamoGraphDeployment documents.*ConfigMap"):
        parse_manifest(doc)
    with pytest.raises(ManifestError, match="holds 2"):
        parse_manifest(graph + "---\n" + graph)


def test_unreadable_yaml_and_missing_files_say_what_to_pass(tmp_path):
    with pytest.raises(ManifestError, match="not valid YAML"):
        parse_manifest("a: [", "x.yaml")
    with pytest.raises(ManifestError, match=r"cannot read .*missing\.yaml"):
        load_manifest(tmp_path / "missing.yaml")


def _page_size_mismatch(g: dict) -> None:
    g["spec"]["services"]["decode"]["extraPodSpec"]["mainContainer"]["args"][0] += " --page-size 32"


def _no_gpu_limit(g: dict) -> None:
    del g["spec"]["services"]["decode"]["resources"]


def _fractional_gpu(g: dict) -> None:
    g["spec"]["services"]["decode"]["resources"]["limits"]["gpu"] = "0.5"


def _no_frontend(g: dict) -> None:
    del g["spec"]["services"]["Frontend"]


def _no_component_type(g: dict) -> None:
    del g["spec"]["services"]["Frontend"]["componentType"]


# Each edit makes GRAPH invalid in a way the operator's validation (not the schema) finds.
INVALID = [_page_size_mismatch, _no_gpu_limit, _fractional_gpu, _no_frontend, _no_component_type]


def _invalid(*edits) -> str:
    graph = yaml.safe_load(GRAPH)
    for edit in edits:
        edit(graph)
    return yaml.safe_dump(graph)


@pytest.mark.parametrize("edit", INVALID, ids=[e.__name__[1:] for e in INVALID])
def test_dynamo_run_refuses_with_the_problems_the_operator_reports(edit, tmp_path):
    text = _invalid(edit)
    operator = render(DynamoGraphDeployment.model_validate(yaml.safe_load(text)), OperatorConfig()).problems
    assert operator, "the edit must make the graph invalid for the operator"
    path = tmp_path / "graph.yaml"
    path.write_text(text)
    with pytest.raises(ManifestError) as got:
        load_manifest(path)
    assert got.value.problems == operator
    lines = str(got.value).splitlines()
    assert lines[0] == f"{path} is not a valid DynamoGraphDeployment:"
    assert lines[1:] == [f"{p.field}: {p.message}" for p in operator]


def test_page_size_mismatch_and_missing_gpu_limit_word_for_word():
    with pytest.raises(ManifestError) as got:
        parse_manifest(_invalid(_page_size_mismatch, _no_gpu_limit), "g.yaml")
    assert [(p.field, p.reason) for p in got.value.problems] == [
        ("spec.services.decode.resources.limits.gpu", "MissingGpuLimit"),
        ("spec.services.decode.extraPodSpec.mainContainer.args", "PageSizeMismatch"),
    ]
    assert str(got.value) == (
        "g.yaml is not a valid DynamoGraphDeployment:\n"
        "spec.services.decode.resources.limits.gpu: Worker 'decode' has no GPU limit; set "
        'resources.limits.gpu to the GPUs per pod (e.g. "1").\n'
        "spec.services.decode.extraPodSpec.mainContainer.args: Prefill 'prefill' runs --page-size 16 but "
        "decode 'decode' runs --page-size 32; the KV cache they hand over must have one layout: set the "
        "same value on both."
    )


def test_a_valid_graph_is_returned():
    assert parse_manifest(GRAPH).spec.services["decode"].component_type == "worker"
