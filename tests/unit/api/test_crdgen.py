"""The CRD generator: the committed YAML matches the models (staleness check), the schema is
structural with enums/minimums/defaults, and the CLI writes several folders and --check fails on drift."""

from __future__ import annotations

from pathlib import Path

import yaml
from dynamo_api import crdgen

REPO = Path(__file__).resolve().parents[3]


def _walk(schema, path=""):
    yield path, schema
    for key, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}.*")


def _version(name: str) -> dict:
    return next(v for v in crdgen.build_crd()["spec"]["versions"] if v["name"] == name)


def test_committed_crds_are_fresh():
    for filename, text in (
        (crdgen.CRD_FILENAME, crdgen.render_crd_yaml()),
        (crdgen.ADAPTER_CRD_FILENAME, crdgen.render_adapter_crd_yaml()),
    ):
        committed = (REPO / "crds" / filename).read_text()
        assert committed == text, "crds/ is stale: run `make crds`"
        chart_copy = REPO / "charts" / "dynamo-operator" / "crds" / filename
        if chart_copy.parent.is_dir():
            assert chart_copy.read_text() == committed, "the chart's CRD is stale: run `make crds`"


def test_adapter_crd_has_dynamos_shape_and_a_scale_subresource():
    crd = crdgen.build_adapter_crd()
    assert crd["metadata"]["name"] == "dynamographdeploymentscalingadapters.nvidia.com"
    assert crd["spec"]["names"]["kind"] == "DynamoGraphDeploymentScalingAdapter"
    assert crd["spec"]["names"]["shortNames"] == ["dgdsa"]
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    nodes = dict(_walk(version["schema"]["openAPIV3Schema"]))
    assert nodes[".spec"]["required"] == ["replicas", "dgdRef"]
    assert nodes[".spec.replicas"]["minimum"] == 0
    assert nodes[".spec.dgdRef"]["required"] == ["name", "serviceName"]
    assert nodes[".spec.dgdRef.serviceName"]["minLength"] == 1
    assert nodes[".status.selector"]["type"] == "string"


def test_crd_shape():
    crd = crdgen.build_crd()
    assert crd["metadata"]["name"] == "dynamographdeployments.nvidia.com"
    assert crd["spec"]["names"]["shortNames"] == ["dgd"]
    served = {v["name"]: (v["served"], v["storage"]) for v in crd["spec"]["versions"]}
    assert served == {"v1beta1": (True, True), "v1alpha1": (True, False)}  # stored as v1beta1, like Dynamo
    for version in crd["spec"]["versions"]:
        assert version["subresources"] == {"status": {}}
        columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
        assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
        assert columns["Backend"] == ".spec.backendFramework"
        assert columns["State"] == ".status.state"
        assert columns["Age"] == ".metadata.creationTimestamp"
    # one status schema, whichever version is read
    status = [v["schema"]["openAPIV3Schema"]["properties"]["status"] for v in crd["spec"]["versions"]]
    assert status[0] == status[1]
    conversion = crd["spec"]["conversion"]
    assert conversion["strategy"] == "Webhook"
    assert conversion["webhook"]["conversionReviewVersions"] == ["v1"]
    assert conversion["webhook"]["clientConfig"]["service"]["path"] == "/convert"


def test_v1beta1_schema_rules():
    nodes = dict(_walk(_version("v1beta1")["schema"]["openAPIV3Schema"]))
    components = nodes[".spec.components"]
    assert components["x-kubernetes-list-type"] == "map"
    assert components["x-kubernetes-list-map-keys"] == ["name"]
    assert "name" in components["items"]["required"]
    assert nodes[".spec.components[].type"]["enum"] == [
        "frontend", "worker", "prefill", "decode", "planner", "epp"
    ]  # fmt: skip
    assert nodes[".spec.components[].replicas"]["minimum"] == 0
    assert nodes[".spec.components[].podTemplate"]["x-kubernetes-preserve-unknown-fields"] is True
    assert nodes[".spec.env"]["type"] == "array"


def test_schema_rules():
    root = _version("v1alpha1")["schema"]["openAPIV3Schema"]
    nodes = dict(_walk(root))
    service = ".spec.services.*"
    assert nodes[f"{service}.componentType"]["enum"][:4] == ["frontend", "worker", "prefill", "decode"]
    assert nodes[".spec.backendFramework"]["enum"] == ["sglang", "vllm", "trtllm"]
    assert nodes[f"{service}.replicas"] == {
        "description": "Pods, or groups of pods when multinode.",
        "type": "integer",
        "minimum": 0,
        "default": 1,
    }
    assert nodes[f"{service}.multinode.nodeCount"]["minimum"] == 2
    assert nodes[f"{service}.resources.limits.gpu"]["x-kubernetes-int-or-string"] is True
    assert nodes[".status.conditions"]["x-kubernetes-list-map-keys"] == ["type"]


def test_structural_and_preserve_unknown_only_where_dynamo_allows():
    """Arbitrary content where Dynamo allows it (a PodSpec, HPA blocks) and in Dynamo's shapes kept as
    given (topologyConstraint, eppConfig, gpuMemoryService: v1beta1 keeps them the same way)."""
    root = _version("v1alpha1")["schema"]["openAPIV3Schema"]
    preserved = sorted(p for p, s in _walk(root) if s.get("x-kubernetes-preserve-unknown-fields"))
    assert preserved == [
        ".spec.services.*.autoscaling.behavior",
        ".spec.services.*.autoscaling.metrics[]",
        ".spec.services.*.eppConfig",
        ".spec.services.*.extraPodSpec",
        ".spec.services.*.extraPodSpec.mainContainer",
        ".spec.services.*.gpuMemoryService",
        ".spec.services.*.topologyConstraint",
        ".spec.topologyConstraint",
    ]
    for path, schema in _walk(root):
        if path == ".metadata":
            continue
        assert "type" in schema or schema.get("x-kubernetes-int-or-string"), f"{path} has no type"
        assert not {"anyOf", "oneOf", "$ref", "nullable"} & set(schema), path


def test_cli_writes_folders_and_check_detects_drift(tmp_path, capsys):
    first, second = tmp_path / "crds", tmp_path / "chart" / "crds"
    assert crdgen.main(["--out", str(first), "--out", str(second)]) == 0
    assert (first / crdgen.CRD_FILENAME).read_text() == (second / crdgen.CRD_FILENAME).read_text()
    assert yaml.safe_load((first / crdgen.CRD_FILENAME).read_text()) == crdgen.build_crd()
    assert yaml.safe_load((second / crdgen.ADAPTER_CRD_FILENAME).read_text()) == crdgen.build_adapter_crd()
    assert crdgen.main(["--check", "--out", str(first)]) == 0
    (first / crdgen.CRD_FILENAME).write_text("stale\n")
    assert crdgen.main(["--check", "--out", str(first), "--out", str(second)]) == 1
    err = capsys.readouterr().err
    assert (
        "is stale: run `make crds`" in err
        and str(second / crdgen.CRD_FILENAME) not in err.split("is stale")[0]
    )
