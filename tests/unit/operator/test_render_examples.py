"""Every manifest under examples/ parses and renders without problems, with the topology it
describes, under both multinode group backends; each v1beta1 example renders exactly like its v1alpha1
twin; NVIDIA Dynamo's v1beta1 SGLang examples that serve render the topology they describe."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from dynamo_api.conversion import load_graph
from dynamo_api.models import DynamoGraphDeployment
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render

from tests.support.dynamo_examples import serving
from tests.support.manifests import graph_of

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*.yaml"))
MODEL = "Qwen/Qwen3-0.6B"
# Examples of other model kinds: a vision-language model, an image-diffusion model.
MODELS = {"multimodal": "Qwen/Qwen2.5-VL-7B-Instruct", "diffusion": "black-forest-labs/FLUX.1-schnell"}


def test_the_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert {
        "agg.yaml",
        "agg-router.yaml",
        "agg-multinode.yaml",
        "disagg.yaml",
        "disagg-router.yaml",
        "disagg-multinode.yaml",
    } <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
@pytest.mark.parametrize("backend", ["lws", "statefulset"])
def test_example_renders(path, backend):
    dgd = DynamoGraphDeployment.model_validate(graph_of(path))
    rendered = render(dgd, OperatorConfig(group_backend=backend))
    assert rendered.problems == ()
    assert not [n for n in rendered.notices if n.warning], "examples raise no warnings"
    assert set(rendered.services) == set(dgd.spec.services)
    for name, service in dgd.spec.services.items():
        if service.component_type in ("frontend", "planner", "epp"):
            continue
        args = service.extra_pod_spec.main_container.args
        model = MODELS.get(path.name.split("-")[0].removesuffix(".yaml"), MODEL)
        assert args[args.index("--served-model-name") + 1] == model, f"{path.name}:{name}"
        plan = rendered.services[name]
        assert plan.nodes_per_replica == service.node_count
        expected = (
            "Deployment"
            if service.node_count == 1
            else {"lws": "LeaderWorkerSet"}.get(backend, "StatefulSet")
        )
        assert plan.kind == expected


def test_disagg_multinode_topology():
    dgd = DynamoGraphDeployment.model_validate(
        yaml.safe_load((EXAMPLES[0].parent / "disagg-multinode.yaml").read_text())
    )
    rendered = render(dgd, OperatorConfig(group_backend="statefulset"))
    for role in ("prefill", "decode"):
        plan = rendered.services[role]
        assert (plan.role, plan.replicas, plan.nodes_per_replica) == (role, 1, 2)
    transport = [n.reason for n in rendered.notices if n.reason.endswith("Transport")]
    assert transport == ["TcpTransport"]


BETA_EXAMPLES = sorted((EXAMPLES[0].parent / "v1beta1").glob("*.yaml"))
DYNAMO_V1BETA1 = serving("v1beta1/")


def test_every_example_has_its_v1beta1_twin():
    assert [p.name for p in BETA_EXAMPLES] == [p.name for p in EXAMPLES]


@pytest.mark.parametrize("path", BETA_EXAMPLES, ids=lambda p: p.name)
def test_v1beta1_example_renders_exactly_like_its_v1alpha1_twin(path):
    beta = graph_of(path)
    alpha = graph_of(path.parents[1] / path.name)
    assert beta["apiVersion"] == "nvidia.com/v1beta1"
    config = OperatorConfig(group_backend="statefulset")
    assert render(load_graph(beta), config) == render(load_graph(alpha), config)


@pytest.mark.parametrize("path", DYNAMO_V1BETA1, ids=lambda p: p.name)
def test_dynamo_v1beta1_example_renders_its_topology(path):
    """NVIDIA Dynamo's own v1beta1 SGLang examples that serve (images changed to ours) render without
    problems: a GPU-limited pod per worker, prefill/decode roles from `type`, multinode groups."""
    raw = yaml.safe_load(path.read_text())
    rendered = render(load_graph(raw), OperatorConfig(group_backend="statefulset"))
    assert rendered.problems == ()
    assert not [n for n in rendered.notices if n.warning]
    for comp in raw["spec"]["components"]:
        plan = rendered.services[comp["name"]]
        assert plan.nodes_per_replica == comp.get("multinode", {}).get("nodeCount", 1)
        if comp["type"] in ("prefill", "decode"):
            assert plan.role == comp["type"]
    assert {c["name"] for c in raw["spec"]["components"]} == set(rendered.services)
