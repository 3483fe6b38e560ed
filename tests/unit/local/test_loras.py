"""dynamo-run's DynamoModels: read beside the graph (refused like the webhook refuses them, naming the
document), relative file:// sources resolved against the manifest's folder (or --adapter-dir), base
models loading nothing, and the serving workers of the base model as targets (every prefill and decode
replica, never the frontend or a multinode rank above 0)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from dynamo_worker.local.loras import Loaded, adapters_of, ready_lines, resolve_uri, targets
from dynamo_worker.local.manifest import ManifestError, parse_manifest, parse_models
from dynamo_worker.local.plan import plan_graph

from tests.support.manifests import MODEL_KIND

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
MODEL = """
---
apiVersion: nvidia.com/v1alpha1
kind: DynamoModel
metadata:
  name: {name}
spec:
  modelName: {name}
  baseModelName: {base}
  modelType: {type}
  {source}
"""


def doc(name: str, base: str = "Qwen/Qwen3-0.6B", type_: str = "lora", source: str = "hf://org/a") -> str:
    return MODEL.format(
        name=name, base=base, type=type_, source=f"source: {{uri: '{source}'}}" if source else ""
    )


def test_the_examples_models_are_read_beside_their_graph():
    for name, count in (("lora-agg.yaml", 2), ("lora-disagg.yaml", 1)):
        text = (EXAMPLES / name).read_text()
        models = parse_models(text, name)
        assert len(models) == count == text.count(f"kind: {MODEL_KIND}")
        assert parse_manifest(text).name.startswith("sglang-lora-")


def test_an_invalid_model_is_refused_naming_the_document_and_the_fix():
    with pytest.raises(ManifestError, match=r"DynamoModel bad is not valid:\nspec.source.uri: a lora model"):
        parse_models(doc("good") + doc("bad", source=""), "f.yaml")
    with pytest.raises(ManifestError, match=r"DynamoModel odd is not valid:\nspec\.modelType"):
        parse_models(doc("odd", type_="qlora"), "f.yaml")


def test_relative_file_sources_resolve_against_the_folder_given(tmp_path):
    assert resolve_uri("file://adapters/a", tmp_path) == f"file://{tmp_path}/adapters/a"
    assert resolve_uri("file://./adapters/../b", tmp_path) == f"file://{tmp_path}/b"
    assert resolve_uri("file:///abs/a", tmp_path) == "file:///abs/a"
    assert resolve_uri("hf://org/a", tmp_path) == "hf://org/a"
    models = parse_models(doc("a", source="file://x/a") + doc("b", type_="base", source=""))
    (adapter,) = adapters_of(models, tmp_path)  # a base model loads nothing
    assert (adapter.resource, adapter.name, adapter.base, adapter.uri) == (
        "a",
        "a",
        "Qwen/Qwen3-0.6B",
        f"file://{tmp_path}/x/a",
    )


def test_the_targets_are_every_serving_worker_of_the_base_model():
    text = (
        (EXAMPLES / "lora-disagg.yaml")
        .read_text()
        .replace("replicas: 1\n      resources", "replicas: 2\n      resources", 1)
    )
    dgd = parse_manifest(text)
    plan = plan_graph(
        dgd,
        engine="mocker",
        nats_url="nats://127.0.0.1:4222",
        http_host="127.0.0.1",
        http_port=8000,
        mocker_model_dir="/tiny",
        sglang_model_path=None,
        gpus=(),
        free_port=itertools.count(20000).__next__,
        machine={},
    )
    assert sorted(p.name for p in targets(plan, dgd, "Qwen/Qwen3-0.6B")) == [
        "decode-0",
        "decode-1",
        "prefill-0",
    ]
    assert targets(plan, dgd, "other/model") == []


def test_the_ready_lines_say_where_each_adapter_is_and_what_failed():
    (adapter,) = adapters_of(parse_models(doc("a")), Path("/"))
    lines = ready_lines([Loaded(adapter, ["decode-0"], ["prefill-0: RankTooLarge: raise --max-lora-rank"])])
    assert lines == ["  adapter: a (base Qwen/Qwen3-0.6B) on decode-0; FAILED on 1 (see the errors above)"]
