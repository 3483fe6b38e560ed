"""Every example that fits this machine, and every NVIDIA Dynamo SGLang manifest that serves here, runs as
real pods under a real kubelet: ``kubectl apply``, ``kubectl wait --for=condition=Ready dgd/NAME``, then the
official ``openai`` client through ``kubectl port-forward`` to the frontend Service, a chat and a stream
with usage; a disaggregated graph's answer went through its prefill and its decode pod.

The graphs start a few at a time (``WINDOW``), each in a namespace of its own, so their pods' start-up
overlaps as it does on a shared cluster. Each test prints its row (Ready time, first-answer time, pods,
restarts) and the rows go to ``<cluster dir>/examples.json``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.real import graphs
from tests.real.conftest import READY_S, REPO, Real
from tests.support.dynamo_examples import FIXTURES, serving

OURS = [
    "agg.yaml",
    "agg-router.yaml",
    "disagg.yaml",
    "disagg-router.yaml",
    "agg-multinode.yaml",
    "disagg-multinode.yaml",
    "disagg-planner.yaml",
    "lora-agg.yaml",
    "lora-disagg.yaml",
    "agg-hicache.yaml",
]
# Our v1beta1 examples are the same graphs as the v1alpha1 ones above, converted by the operator's webhook
# into the same pods: two of them run here (a pair and a multinode group, through the webhook of the
# operator pod); every one reaches Ready on the kwok tier (tests/integration/operator/
# test_operator_conversion.py). The real pods of the other eight would repeat those of their twins and
# cost CI minutes.
BETA = ["disagg.yaml", "disagg-multinode.yaml"]
GRAPHS = [
    *(REPO / "examples" / name for name in OURS),
    *(REPO / "examples" / "v1beta1" / name for name in BETA),
    *serving(),
]
# Not here: gateway.yaml and Dynamo's agg_epp.yaml (not in serving()): a graph with an endpoint picker
# serves through a Gateway API gateway, which test_gateway_pods.py puts in front of gateway.yaml's graph
# (Envoy as a pod, with GAIE's InferencePool CRD); the kwok tier checks that Dynamo's reaches Ready with
# its picker, Services and InferencePool (tests/integration/operator/test_operator_endpoint_picker.py).
# Nor the multimodal and diffusion examples (their encode and diffusion workers load a real model with HF
# transformers, which the CPU image does not carry) and Dynamo's embedding and image manifests (served
# by dynamo-run's e2e tier; the same worker modules).
GRAPHS = [g for g in GRAPHS if "embed" not in g.name and "diffusion" not in g.name]
WINDOW = 6
pytestmark = pytest.mark.timeout(600)  # the first also waits for the operator's helm install


def _id(path: Path) -> str:
    root = FIXTURES if FIXTURES in path.parents else REPO / "examples"
    return ("dynamo/" if root == FIXTURES else "") + str(path.relative_to(root))


class Window:
    """Applies the graphs ahead of the test that checks them, ``WINDOW`` at a time."""

    def __init__(self, real: Real) -> None:
        self.real = real
        self.graphs: dict[int, graphs.Graph] = {}
        self.rows: list[dict[str, object]] = []

    def graph(self, index: int) -> graphs.Graph:
        for i in range(index, min(index + WINDOW, len(GRAPHS))):
            if i not in self.graphs:
                ns = f"ex{i}-{uuid.uuid4().hex[:5]}"
                self.real.kubectl("create", "namespace", ns)
                self.graphs[i] = graphs.Graph(GRAPHS[i], ns)
                graphs.apply(self.real, self.graphs[i])
        return self.graphs[index]

    def done(self, index: int) -> None:
        g = self.graphs[index]
        self.real.kubectl("delete", "namespace", g.namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def window(real: Real, operator: dict[str, float]) -> Iterator[Window]:
    w = Window(real)
    yield w
    (real.dir / "examples.json").write_text(json.dumps(w.rows, indent=2))
    for i in list(w.graphs):
        w.done(i)


def _role(pod: dict[str, object]) -> str:
    """prefill or decode for a disaggregated worker pod (its engine's --disaggregation-mode), else ''."""
    for c in pod["spec"]["containers"]:  # type: ignore[index]
        words = " ".join([*c.get("command", []), *c.get("args", [])]).split()
        if "--disaggregation-mode" in words[:-1]:
            return str(words[words.index("--disaggregation-mode") + 1])
    return ""


@pytest.mark.parametrize("index", range(len(GRAPHS)), ids=[_id(p) for p in GRAPHS])
def test_example_is_ready_and_answers_through_port_forward(real: Real, window: Window, index: int) -> None:
    g = window.graph(index)
    try:
        ready_s = graphs.wait_ready(real, g, READY_S)
        answer = graphs.ask(real, g.namespace)
        assert answer.chat and answer.streamed
        assert (
            answer.usage is not None and answer.usage.completion_tokens > 0 and answer.usage.prompt_tokens > 0
        )
        for model in (d for d in g.docs if d["kind"] == "DynamoModel"):  # an adapter, from its volume
            name = model["metadata"]["name"]
            ready = ["--for=condition=Ready", f"dynamomodel/{name}", "--timeout=120s"]
            real.kubectl("wait", "-n", g.namespace, *ready, timeout=150)
            adapter = graphs.ask(real, g.namespace, model=model["spec"]["modelName"])
            assert adapter.chat and adapter.usage is not None and adapter.usage.completion_tokens > 0
        pods = real.pods(g.namespace)
        roles = {p["metadata"]["name"]: _role(p) for p in pods}
        prefill = [n for n, role in roles.items() if role == "prefill"]
        decode = [n for n, role in roles.items() if role == "decode"]
        if prefill:  # disaggregated: the answer went through a prefill and a decode pod
            assert any(graphs.worker_requests(real, g.namespace, p) > 0 for p in prefill), (
                "no prefill leg served"
            )
            assert any(graphs.worker_requests(real, g.namespace, d) > 0 for d in decode), (
                "no decode leg served"
            )
        restarts = sum(
            cs.get("restartCount", 0) for p in pods for cs in p["status"].get("containerStatuses", [])
        )
        row = {
            "graph": _id(g.path),
            "ready_s": round(ready_s, 1),
            "first_answer_s": round(answer.first_answer_s, 2),
            "pods": len(pods),
            "restarts": restarts,
        }
        window.rows.append(row)
        print(row)
    except BaseException:
        print(real.explain(g.namespace))
        raise
    finally:
        window.done(index)
