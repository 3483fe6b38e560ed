"""Production faults on real pods, under steady streamed load through ``kubectl port-forward`` to the
frontend Service: each test breaks one thing the way an operator of a cluster does and records a row of
the fault table (``make faults`` writes them into docs/faults.md): what was done, the bound, the time to
the state a user waits for, and the requests lost (any that did not finish with a finish reason).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest

from tests.real import graphs
from tests.real.conftest import READY_S, REPO, Real, port_forward
from tests.support import realnode
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(600)
STREAMS = 4  # concurrent clients of the load
LOAD_S = 300.0  # no load runs longer than this, whatever the test does


@dataclass
class Load:
    """``STREAMS`` clients that each send one streamed chat after another until stopped."""

    port: int
    model: str = graphs.MODEL
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def _client(self) -> None:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none", timeout=60, max_retries=0
        )
        deadline = time.monotonic() + LOAD_S
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                stream = client.chat.completions.create(
                    model=self.model,
                    messages=[{"role": "user", "content": f"Tell a story {uuid.uuid4().hex}"}],
                    max_tokens=24,
                    stream=True,
                )
                finish = [
                    c.choices[0].finish_reason for c in stream if c.choices and c.choices[0].finish_reason
                ]
                if finish:
                    self.ok += 1
                else:
                    self.failed.append("a stream ended without a finish reason")
            except openai.OpenAIError as e:
                self.failed.append(f"{type(e).__name__}: {e}")

    def __enter__(self) -> Load:
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(STREAMS)]
        for t in self.threads:
            t.start()
        self.wait_for(STREAMS)
        return self

    def wait_for(self, more: int, timeout: float = 60) -> None:
        """Until ``more`` further requests succeeded."""
        target = self.ok + more
        wait_until(
            lambda: self.ok >= target,
            f"{target} answers of the load",
            timeout_s=timeout,
            interval_s=0.1,
            explain=lambda: f"it got {self.ok}; failures: {self.failed[-3:]}",
        )

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=70)


@contextlib.contextmanager
def under_load(real: Real, namespace: str) -> Iterator[Load]:
    """The load, through ``kubectl port-forward`` to the graph's frontend Service."""
    with (
        port_forward(namespace, f"svc/{graphs.frontend_service(real, namespace)}", 8000) as port,
        Load(port) as load,
    ):
        yield load


def _no_request_lost(row: Any, load: Load) -> None:
    row.lost = len(load.failed)
    assert not load.failed, load.failed[:5]
    assert row.within_bound()


@pytest.fixture
def disagg(real: Real, operator: dict[str, float], namespace: str) -> Iterator[graphs.Graph]:
    """examples/disagg.yaml with two decode workers and a scaling adapter on decode, Ready."""
    g = graphs.Graph(REPO / "examples" / "disagg.yaml", namespace)

    def two_decoders(dgd: dict) -> None:
        dgd["spec"]["services"]["decode"].update(replicas=2, scalingAdapter={"enabled": True})

    graphs.apply(real, g, two_decoders)
    graphs.wait_ready(real, g, READY_S)
    _wait_replicas(real, namespace, "sglang-disagg-decode", 2)
    yield g


def _wait_replicas(real: Real, namespace: str, deployment: str, n: int, timeout: float = READY_S) -> None:
    def settled() -> bool:
        st = real.json("get", "deployment", deployment, "-n", namespace).get("status", {})
        return all(st.get(k, 0) == n for k in ("readyReplicas", "replicas", "updatedReplicas"))

    wait_until(settled, f"{deployment}: {n} ready replicas", timeout_s=timeout, interval_s=0.5)


def _decode_pods(real: Real, namespace: str) -> list[str]:
    pods = real.pods(namespace, "nvidia.com/dynamo-component=decode")
    return [p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")]


def test_a_deleted_decode_pod_loses_no_request(real: Real, disagg: graphs.Graph, fault_row) -> None:
    row = fault_row(
        "real pods: decode pod deleted",
        "kubectl delete pod of 1 of 2 decode workers under 4 streams: back to 2 Ready",
        120.0,
    )
    ns = disagg.namespace
    with under_load(real, ns) as load:
        victim = _decode_pods(real, ns)[0]
        with row.timing():
            real.kubectl("delete", "pod", victim, "-n", ns, "--wait=false")
            load.wait_for(8)
            _wait_replicas(real, ns, "sglang-disagg-decode", 2)
        load.wait_for(4)
    _no_request_lost(row, load)


def test_scaling_decode_down_through_its_adapter_fails_no_request(
    real: Real, disagg: graphs.Graph, fault_row
) -> None:
    row = fault_row(
        "real pods: scale-down",
        "kubectl scale dgdsa decode 2 -> 1 under 4 streams: the removed worker drains on SIGTERM",
        90.0,
    )
    ns = disagg.namespace
    with under_load(real, ns) as load:
        with row.timing():
            real.kubectl("scale", "dgdsa/sglang-disagg-decode", "-n", ns, "--replicas=1")
            _wait_replicas(real, ns, "sglang-disagg-decode", 1)
            wait_until(  # gone, not only terminating
                lambda: len(real.pods(ns, "nvidia.com/dynamo-component=decode")) == 1,
                "the removed decode pod gone",
                timeout_s=90,
                interval_s=0.5,
            )
        load.wait_for(8)
    _no_request_lost(row, load)


def test_a_rolling_update_of_decode_fails_no_request(real: Real, disagg: graphs.Graph, fault_row) -> None:
    row = fault_row(
        "real pods: rolling update",
        "one decode argument changed under 4 streams: both pods replaced, graph Ready",
        180.0,
    )
    ns = disagg.namespace
    dgd = disagg.dgd
    dgd["spec"]["services"]["decode"]["extraPodSpec"]["mainContainer"]["args"] += [
        "--max-running-requests",
        "64",
    ]
    with under_load(real, ns) as load:
        old = set(_decode_pods(real, ns))
        with row.timing():
            real.apply(ns, [dgd])
            wait_until(
                lambda: not (set(pods := _decode_pods(real, ns)) & old) and len(pods) == 2,
                "both decode pods replaced",
                timeout_s=180,
                interval_s=0.5,
            )
            _wait_replicas(real, ns, "sglang-disagg-decode", 2)
            graphs.wait_ready(real, disagg, 180 + time.monotonic() - disagg.applied_at)
        load.wait_for(8)
    _no_request_lost(row, load)


def _graph_children(real: Real, namespace: str) -> dict[str, int]:
    out = {}
    for kind in ("deployments", "statefulsets", "services", "pods"):
        items = real.json("get", kind, "-n", namespace)["items"]
        out[kind] = len([i for i in items if not i["metadata"].get("deletionTimestamp")])
    return out


def test_kubectl_replace_and_helm_upgrade_force_leak_and_duplicate_nothing(
    real: Real, operator: dict[str, float], namespace: str, fault_row
) -> None:
    row = fault_row(
        "real pods: replace / helm upgrade --force",
        "kubectl replace of a graph, then helm upgrade --force of the operator: workloads counted",
        0.0,
    )
    row.unit = "leaks"
    g = graphs.Graph(REPO / "examples" / "agg.yaml", namespace)
    graphs.apply(real, g)
    graphs.wait_ready(real, g, READY_S)
    before = _graph_children(real, namespace)
    live = real.json("get", f"{g.resource}/{g.name}", "-n", namespace)  # as applied: v1alpha1
    live["spec"]["services"]["decode"]["envs"] = [{"name": "REPLACED", "value": "1"}]
    for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        live["metadata"].pop(key, None)
    live.pop("status", None)
    real.kubectl("replace", "-n", namespace, "-f", "-", input=json.dumps(live))
    args = realnode.helm_upgrade("--force")
    r = subprocess.run(["helm", *args], capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr

    def settled() -> dict[str, int] | None:
        """The children once the replaced decode pods run and their count is back to before."""
        pods = real.pods(namespace, "nvidia.com/dynamo-component=decode")
        rolled = pods and all(
            any(e["name"] == "REPLACED" for e in p["spec"]["containers"][0].get("env", [])) for p in pods
        )
        after = _graph_children(real, namespace)
        return after if rolled and after == before else None

    after = wait_until(
        settled,
        f"the decode pods replaced and the children as before ({before})",
        timeout_s=READY_S,
        interval_s=1,
        explain=lambda: str(_graph_children(real, namespace)),
    )
    stored = "dynamographdeployments.v1beta1.nvidia.com"  # no conversion: the operator was just replaced
    graphs.wait_ready(real, g, READY_S + time.monotonic() - g.applied_at, resource=stored)
    row.observed_s = float(sum(after.values()) - sum(before.values()))
    assert row.within_bound()


def test_the_operator_pod_killed_mid_reconcile_resumes_and_leaves_children_alone(
    real: Real, operator: dict[str, float], namespace: str, fault_row
) -> None:
    row = fault_row(
        "real pods: operator pod killed",
        "kubectl delete --force of the operator pod once a new graph's "
        "first child exists: graph Ready, no duplicates",
        180.0,
    )
    g = graphs.Graph(REPO / "examples" / "disagg.yaml", namespace)
    with row.timing():
        graphs.apply(real, g)
        wait_until(
            lambda: real.json("get", "deployments", "-n", namespace)["items"],
            "the graph's first child",
            timeout_s=60,
            interval_s=0.1,
        )
        op = real.pods(realnode.RELEASE, "app.kubernetes.io/component=operator")[0]["metadata"]["name"]
        real.kubectl("delete", "pod", op, "-n", realnode.RELEASE, "--grace-period=0", "--force")
        # Read at the stored version: v1alpha1 reads need the conversion webhook, down with the operator.
        graphs.wait_ready(real, g, READY_S, resource="dynamographdeployments.v1beta1.nvidia.com")
    kids = _graph_children(real, namespace)
    assert kids["deployments"] == 3, kids  # frontend, prefill, decode: once each
    assert row.within_bound()


def test_a_restarted_nats_pod_and_discovery_and_routing_recover(
    real: Real, disagg: graphs.Graph, fault_row
) -> None:
    row = fault_row(
        "real pods: NATS pod restarted",
        "kubectl delete pod of the NATS StatefulSet under 4 streams: NATS Ready again and requests answered",
        120.0,
    )
    ns = disagg.namespace
    nats = real.pods(realnode.RELEASE, "app.kubernetes.io/component=nats")[0]["metadata"]["name"]
    with under_load(real, ns) as load, row.timing():
        real.kubectl("delete", "pod", nats, "-n", realnode.RELEASE)
        real.kubectl("wait", "--for=condition=Ready", f"pod/{nats}", "-n", realnode.RELEASE, "--timeout=120s")
        load.wait_for(8)
    _no_request_lost(row, load)


def test_a_container_oom_killed_at_its_limit_restarts_and_the_graph_names_it(
    real: Real, operator: dict[str, float], namespace: str, fault_row
) -> None:
    row = fault_row(
        "real pods: OOM-killed container",
        "a decode worker with a 48Mi memory limit: killed by the kernel, restarted, Ready names it",
        120.0,
    )
    g = graphs.Graph(REPO / "examples" / "agg.yaml", namespace)

    def small(dgd: dict) -> None:
        dgd["spec"]["services"]["decode"]["resources"]["limits"]["memory"] = "48Mi"

    with row.timing():
        graphs.apply(real, g, small)

        def oom_named() -> dict | None:
            conds = real.json("get", "dgd", g.name, "-n", namespace).get("status", {}).get("conditions", [])
            ready = next((c for c in conds if c["type"] == "Ready"), {})
            return ready if "OOMKilled" in ready.get("message", "") else None

        ready = wait_until(oom_named, "the Ready condition naming OOMKilled", timeout_s=120, interval_s=1)
    pod = real.pods(namespace, "nvidia.com/dynamo-component=decode")[0]
    assert pod["status"]["containerStatuses"][0]["restartCount"] >= 1
    assert "raise the service's resources.limits.memory" in ready["message"]
    assert row.within_bound()
