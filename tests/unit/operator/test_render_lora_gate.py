"""The LoRA readiness gate on a graph's pods: every prefill, decode and aggregated worker started with
--enable-lora (or --lora-paths) carries it, beside the pairing gate of a disaggregated graph; workers
without LoRA, the frontend, and the non-leader ranks of a multinode group do not."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from dynamo_api.models import DynamoGraphDeployment
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render
from dynamo_operator.render.lora_gate import LORA_GATE_CONDITION
from dynamo_operator.render.revision import PAIRED_CONDITION

from tests.support.manifests import graph_of

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def gates(manifest: dict, backend: str = "statefulset") -> dict[str, list[str]]:
    """Readiness gates of each pod template, by workload name (LWS: leader/worker templates)."""
    rendered = render(DynamoGraphDeployment.model_validate(manifest), OperatorConfig(group_backend=backend))
    assert rendered.problems == ()
    out = {}
    for obj in rendered.objects:
        spec = obj.get("spec") or {}
        templates = {obj["metadata"]["name"]: spec.get("template")}
        if obj["kind"] == "LeaderWorkerSet":
            lws = spec["leaderWorkerTemplate"]
            templates = {"leader": lws["leaderTemplate"], "worker": lws["workerTemplate"]}
        for name, template in templates.items():
            if template:
                out[name] = [g["conditionType"] for g in template["spec"].get("readinessGates", [])]
    return out


def test_lora_workers_carry_the_gate_and_others_do_not():
    assert gates(graph_of(EXAMPLES / "lora-agg.yaml")) == {
        "sglang-lora-agg-frontend": [],
        "sglang-lora-agg-decode": [LORA_GATE_CONDITION],
    }
    assert gates(graph_of(EXAMPLES / "lora-disagg.yaml")) == {
        "sglang-lora-disagg-frontend": [],
        "sglang-lora-disagg-decode": [LORA_GATE_CONDITION, PAIRED_CONDITION],
        "sglang-lora-disagg-prefill": [LORA_GATE_CONDITION, PAIRED_CONDITION],
    }
    assert gates(graph_of(EXAMPLES / "agg.yaml")) == {"sglang-agg-frontend": [], "sglang-agg-decode": []}


def test_lora_paths_alone_enable_it():
    graph = copy.deepcopy(graph_of(EXAMPLES / "agg.yaml"))
    graph["spec"]["services"]["decode"]["extraPodSpec"]["mainContainer"]["args"] += ["--lora-paths", "a=/x/a"]
    assert gates(graph)["sglang-agg-decode"] == [LORA_GATE_CONDITION]


@pytest.mark.parametrize("backend", ["statefulset", "lws"])
def test_a_multinode_group_is_gated_by_its_leader(backend):
    graph = copy.deepcopy(graph_of(EXAMPLES / "agg-multinode.yaml"))
    (service,) = [s for s in graph["spec"]["services"].values() if s.get("multinode")]
    service["extraPodSpec"]["mainContainer"]["args"] += ["--enable-lora", "--max-lora-rank", "8"]
    found = gates(graph, backend)
    if backend == "lws":
        assert (found["leader"], found["worker"]) == ([LORA_GATE_CONDITION], [])
    else:
        leaders = [n for n, g in found.items() if g == [LORA_GATE_CONDITION]]
        members = [n for n in found if n.endswith("-w")]
        assert len(leaders) == 1 and members and all(found[n] == [] for n in members)
