"""Production faults on real pods, under steady streamed load through ``kubectl port-forward`` to the
frontend Service: each test breaks one thing the way an operator of a cluster does and records a row of
the fault table (``make faults`` writes them into docs/faults.md): what was done, the bound, the time to
the state a user waits for, and the requests lost (any that did not finish with a finish reason).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import openai
import pytest

from tests.real import graphs
from tests.real.conftest import READY_S, REPO, Real, port_forward
from tests.support import realnode

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
        target, deadline = self.ok + more, time.monotonic() + timeout
        while self.ok < target:
            assert time.monotonic() < deadline, (
                f"the load got {self.ok}/{target} answers; failures: {self.failed[-3:]}"
            )
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=70)


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


def _wait_replicas(real: Real, namespace: str, deployment: str, n: int, timeout: float = READY_S) -> float:
    t0 = time.monotonic()
    while True:
        d = real.json("get", "deployment", deployment, "-n", namespace)
        st = d.get("status", {})
        if (
            st.get("readyReplicas", 0) == n
            and st.get("replicas", 0) == n
            and st.get("updatedReplicas", 0) == n
        ):
            return time.monotonic() - t0
        assert time.monotonic() - t0 < timeout, f"{deployment}: {st} after {timeout:.0f}s, wanted {n} ready"
        time.sleep(0.5)


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
    with port_forward(ns, f"svc/{graphs.frontend_service(real, ns)}", 8000) as port, Load(port) as load:
        victim = _decode_pods(real, ns)[0]
        with row.timing():
            real.kubectl("delete", "pod", victim, "-n", ns, "--wait=false")
            load.wait_for(8)
            _wait_replicas(real, ns, "sglang-disagg-decode", 2)
        load.wait_for(4)
    row.lost = len(load.failed)
    assert not load.failed, load.failed[:5]
    assert row.within_bound()


def test_scaling_decode_down_through_its_adapter_fails_no_request(
    real: Real, disagg: graphs.Graph, fault_row
) -> None:
    row = fault_row(
        "real pods: scale-down",
        "kubectl scale dgdsa decode 2 -> 1 under 4 streams: the removed worker drains on SIGTERM",
        90.0,
    )
    ns = disagg.namespace
    with port_forward(ns, f"svc/{graphs.frontend_service(real, ns)}", 8000) as port, Load(port) as load:
        with row.timing():
            real.kubectl("scale", "dgdsa/sglang-disagg-decode", "-n", ns, "--replicas=1")
            _wait_replicas(real, ns, "sglang-disagg-decode", 1)
            deadline = time.monotonic() + 90
            while len(real.pods(ns, "nvidia.com/dynamo-component=decode")) != 1:  # gone, not only terminating
                assert time.monotonic() < deadline, "the removed decode pod did not exit within 90 s"
                time.sleep(0.5)
        load.wait_for(8)
    row.lost = len(load.failed)
    assert not load.failed, load.failed[:5]
    assert row.within_bound()


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
    with port_forward(ns, f"svc/{graphs.frontend_service(real, ns)}", 8000) as port, Load(port) as load:
        old = set(_decode_pods(real, ns))
        with row.timing():
            real.apply(ns, [dgd])
            deadline = time.monotonic() + 180
            while set(_decode_pods(real, ns)) & old or len(_decode_pods(real, ns)) != 2:
                assert time.monotonic() < deadline, "the rollout did not replace both decode pods"
                time.sleep(0.5)
            _wait_replicas(real, ns, "sglang-disagg-decode", 2)
            graphs.wait_ready(real, disagg, 180 + time.monotonic() - disagg.applied_at)
        load.wait_for(8)
    row.lost = len(load.failed)
    assert not load.failed, load.failed[:5]
    assert row.within_bound()


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
    deadline = time.monotonic() + READY_S
    while True:
        after = _graph_children(real, namespace)
        pods = real.pods(namespace, "nvidia.com/dynamo-component=decode")
        rolled = pods and all(
            any(e["name"] == "REPLACED" for e in p["spec"]["containers"][0].get("env", [])) for p in pods
        )
        if rolled and after == before:
            break
        assert time.monotonic() < deadline, f"children {after} (before {before}), decode rolled: {rolled}"
        time.sleep(1)
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
        deadline = time.monotonic() + 60
        while not real.json("get", "deployments", "-n", namespace)["items"]:
            assert time.monotonic() < deadline, "the operator made no child within 60 s"
            time.sleep(0.1)
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
    with port_forward(ns, f"svc/{graphs.frontend_service(real, ns)}", 8000) as port, Load(port) as load:  # noqa: SIM117
        with row.timing():
            real.kubectl("delete", "pod", nats, "-n", realnode.RELEASE)
            real.kubectl(
                "wait", "--for=condition=Ready", f"pod/{nats}", "-n", realnode.RELEASE, "--timeout=120s"
            )
            load.wait_for(8)
    row.lost = len(load.failed)
    assert not load.failed, load.failed[:5]
    assert row.within_bound()


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
        deadline = time.monotonic() + 120
        while True:
            conds = real.json("get", "dgd", g.name, "-n", namespace).get("status", {}).get("conditions", [])
            ready = next((c for c in conds if c["type"] == "Ready"), {})
            if "OOMKilled" in ready.get("message", ""):
                break
            assert time.monotonic() < deadline, f"Ready is {ready} after 120 s"
            time.sleep(1)
    pod = real.pods(namespace, "nvidia.com/dynamo-component=decode")[0]
    assert pod["status"]["containerStatuses"][0]["restartCount"] >= 1
    assert "raise the service's resources.limits.memory" in ready["message"]
    assert row.within_bound()
