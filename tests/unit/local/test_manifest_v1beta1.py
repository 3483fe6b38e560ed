"""dynamo-run reads NVIDIA Dynamo's v1beta1 manifests too: a v1beta1 file gives the same graph as its
v1alpha1 twin, and a v1beta1 mistake is reported at its own field path."""

from __future__ import annotations

from pathlib import Path

import pytest
from dynamo_worker.local.manifest import ManifestError, graph_view, load_manifest, parse_manifest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", ["agg.yaml", "disagg.yaml", "disagg-multinode.yaml"])
def test_v1beta1_manifest_gives_the_graph_of_its_v1alpha1_twin(name):
    beta = load_manifest(REPO / "examples" / "v1beta1" / name)
    alpha = load_manifest(REPO / "examples" / name)
    assert graph_view(beta) == graph_view(alpha)


def test_dynamo_v1beta1_example_runs_its_components():
    graph, _ = graph_view(load_manifest(REPO / "tests" / "fixtures" / "dynamo-v1beta1" / "disagg.yaml"))
    by_name = {s.name: s for s in graph.services}
    assert set(by_name) == {"Frontend", "prefill", "decode"}
    assert by_name["prefill"].gpus_per_node == 1
    assert by_name["prefill"].env_from_secret == "hf-token-secret"
    assert by_name["decode"].command == ("python3", "-m", "dynamo.sglang")


def test_v1beta1_mistake_names_its_field():
    text = """
apiVersion: nvidia.com/v1beta1
kind: DynamoGraphDeployment
metadata: {name: g}
spec:
  components:
    - {name: Frontend, type: frontend, replicas: -1}
"""
    with pytest.raises(ManifestError, match=r"spec\.components\[0\]\.replicas"):
        parse_manifest(text)
