"""A graph manifest as the real-node tier applies it, and what a user does next: wait for it, then ask the
frontend through ``kubectl port-forward`` with the official ``openai`` client.

The manifests are used as users use them. Only what a cluster needs and ``dynamo-run`` does not is
changed: images become the CPU runtime image built here (Dynamo's fixtures name a registry image), a
LoRA adapter's ``file://adapters/...`` (which only dynamo-run resolves) becomes ``file:///adapters/...`` of
a read-only volume of examples/adapters that every worker mounts, and the ``hf-token-secret`` that
Dynamo's manifests read is created empty.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import yaml

from tests.real.conftest import REPO, Real, port_forward
from tests.support import realnode

ADAPTERS = REPO / "examples" / "adapters"
MODEL = "Qwen/Qwen3-0.6B"


@dataclass
class Graph:
    """One manifest file applied in a namespace of its own."""

    path: Path
    namespace: str
    docs: list[dict[str, Any]] = field(default_factory=list)
    applied_at: float = 0.0

    @property
    def dgd(self) -> dict[str, Any]:
        return next(d for d in self.docs if d["kind"] == "DynamoGraphDeployment")

    @property
    def name(self) -> str:
        return str(self.dgd["metadata"]["name"])

    @property
    def resource(self) -> str:
        """``dgd`` at the manifest's own API version."""
        return f"dynamographdeployments.{self.dgd['apiVersion'].split('/')[1]}.nvidia.com"


def _services(dgd: dict[str, Any]) -> list[dict[str, Any]]:
    spec = dgd["spec"]
    return list(spec["services"].values()) if "services" in spec else list(spec.get("components", []))


def _pod_specs(service: dict[str, Any]) -> list[dict[str, Any]]:
    """Where a service's pod spec lives in either API version (made when absent)."""
    if "podTemplate" in service or "componentType" not in service:  # v1beta1
        return [service.setdefault("podTemplate", {}).setdefault("spec", {})]
    return [service.setdefault("extraPodSpec", {})]


def for_cluster(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    uses_adapters = False
    for doc in docs:
        uri = str(doc["spec"].get("source", {}).get("uri", "")) if doc["kind"] == "DynamoModel" else ""
        if uri.startswith("file://") and not uri.startswith("file:///"):  # relative to the manifest
            adapter = (path.parent / uri[len("file://") :]).resolve().relative_to(ADAPTERS)
            doc["spec"]["source"]["uri"] = f"file:///adapters/{adapter}"
            uses_adapters = True
    dgd = next(d for d in docs if d["kind"] == "DynamoGraphDeployment")
    for service in _services(dgd):
        for spec in _pod_specs(service):
            for key in ("mainContainer", "containers"):
                containers = spec.get(key)
                for c in [containers] if isinstance(containers, dict) else containers or []:
                    if "image" in c:
                        c["image"] = realnode.RUNTIME_IMAGE
            if uses_adapters:
                spec.setdefault("volumes", []).append(
                    {"name": "adapters", "hostPath": {"path": str(ADAPTERS), "type": "Directory"}}
                )
                main = spec.setdefault("mainContainer", {}) if "componentType" in service else None
                mounts = {"name": "adapters", "mountPath": "/adapters", "readOnly": True}
                if main is not None:
                    main.setdefault("volumeMounts", []).append(mounts)
                else:
                    for c in spec.setdefault("containers", [{"name": "main"}]):
                        c.setdefault("volumeMounts", []).append(mounts)
    return docs


def apply(real: Real, graph: Graph, edit: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Create the ``hf-token-secret`` the manifest may read, then ``kubectl apply`` it (``edit`` changes
    the graph first)."""
    graph.docs = for_cluster(graph.path)
    if edit is not None:
        edit(graph.dgd)
    real.kubectl(
        "create", "secret", "generic", "hf-token-secret", "-n", graph.namespace, "--from-literal=HF_TOKEN="
    )
    graph.applied_at = time.monotonic()
    real.apply(graph.namespace, graph.docs)


def wait_ready(real: Real, graph: Graph, timeout: float, resource: str | None = None) -> float:
    """Seconds from ``kubectl apply`` to the graph's Ready condition (read at the manifest's API version,
    or at ``resource``: the stored v1beta1 needs no conversion webhook, where the operator may be down)."""
    left = max(1, int(timeout - (time.monotonic() - graph.applied_at)))
    real.kubectl(
        "wait",
        "-n",
        graph.namespace,
        "--for=condition=Ready",
        f"{resource or graph.resource}/{graph.name}",
        f"--timeout={left}s",
        timeout=left + 30,
    )
    return time.monotonic() - graph.applied_at


def frontend_service(real: Real, namespace: str) -> str:
    for svc in real.json("get", "services", "-n", namespace)["items"]:
        if (
            any(p.get("port") == 8000 for p in svc["spec"].get("ports", []))
            and svc["spec"].get("clusterIP") != "None"
        ):
            return str(svc["metadata"]["name"])
    raise AssertionError(f"no frontend Service (port 8000) in {namespace}")


@dataclass
class Answer:
    chat: str
    streamed: str
    usage: Any
    first_answer_s: float


def ask(real: Real, namespace: str, model: str = MODEL) -> Answer:
    """A chat and a stream with usage through ``kubectl port-forward svc/<frontend> :8000``."""
    with port_forward(namespace, f"svc/{frontend_service(real, namespace)}", 8000) as port:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=60, max_retries=0
        )
        t0 = time.monotonic()
        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hello!"}], max_tokens=8
        )
        first = time.monotonic() - t0
        chunks = list(
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Count to five."}],
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return Answer(chat.choices[0].message.content or "", streamed, chunks[-1].usage, first)


def worker_requests(real: Real, namespace: str, pod: str) -> float:
    """``dynamo_worker_requests_total`` of a worker pod, read from its system port through the API server."""
    text = real.kubectl("get", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}:9090/proxy/metrics")
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("dynamo_worker_requests_total")
    )
