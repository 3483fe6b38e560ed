"""The endpoint picker behind a real Envoy, every part a pod on the real node, as a team on Gateway API
runs it: ``helm upgrade`` with GAIE's InferencePool CRD (``inferenceExtension.installCRD=true``),
``kubectl apply`` of examples/gateway.yaml's graph, and Envoy configured from the InferencePool the
operator rendered, the way GAIE's gateways read one: the picker's Service and port from
``endpointPickerRef``, fail-closed from its ``failureMode``, with docs/gateway-api-envoy.yaml.

The example's HTTPRoute is not applied: a gateway controller reads it (and its Gateway), and this tier runs
none; the Envoy pod stands for what such a controller runs. The pool selects exactly the graph's two
frontend pods. Through ``kubectl port-forward`` to Envoy, the official ``openai`` client: every answer
comes back, each request ran on the worker the picker named, the frontends served that choice without
falling back to their own router, and a conversation's turns stayed on one worker although they
alternate between the two frontend replicas.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Iterator

import openai
import pytest

from tests.real import graphs
from tests.real.conftest import READY_S, REPO, Real, port_forward
from tests.support import realnode
from tests.support.envoy import envoy_config
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(600)

CRD = "inferencepools.inference.networking.k8s.io"
COMPONENT_TYPE = "nvidia.com/dynamo-component-type"  # the operator's pod label
GATEWAY_PORT = 8080


@pytest.fixture(scope="module")
def gaie(real: Real, operator: dict[str, float]) -> None:
    """The chart's InferencePool CRD, as a user without a GAIE-installing gateway adds it."""
    r = subprocess.run(
        ["helm", *realnode.helm_upgrade("--set", "inferenceExtension.installCRD=true")],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert r.returncode == 0, f"helm upgrade failed: {r.stderr.strip()}"
    real.kubectl("wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=60s", timeout=90)


@pytest.fixture(scope="module")
def gateway(real: Real, gaie: None) -> Iterator[tuple[graphs.Graph, dict[str, str]]]:
    """The graph Ready and an Envoy pod in front of its picker; yields the graph and each worker pod's
    instance id (from its ``Worker ready`` log line) by pod name."""
    ns = f"gateway-{uuid.uuid4().hex[:5]}"
    real.kubectl("create", "namespace", ns)
    g = graphs.Graph(REPO / "examples" / "gateway.yaml", ns)
    try:
        g.docs = [d for d in graphs.for_cluster(g.path) if d["kind"] == "DynamoGraphDeployment"]
        g.applied_at = time.monotonic()
        real.apply(ns, g.docs)
        graphs.wait_ready(real, g, READY_S)
        pool = real.json("get", f"{CRD}/{g.name}-pool", "-n", ns)
        selector = ",".join(f"{k}={v}" for k, v in pool["spec"]["selector"]["matchLabels"].items())
        selected = {p["metadata"]["name"] for p in real.pods(ns, selector)}
        frontends = {p["metadata"]["name"] for p in real.pods(ns, f"{COMPONENT_TYPE}=frontend")}
        assert selected == frontends and len(frontends) == 2, (selected, frontends)
        ref = pool["spec"]["endpointPickerRef"]
        config = envoy_config(
            GATEWAY_PORT,
            ref["port"]["number"],
            failure_mode_allow=ref.get("failureMode") == "FailOpen",
            gateway_address="0.0.0.0",
            epp_host=f"{ref['name']}.{ns}.svc.cluster.local",
        )
        real.apply(ns, envoy_pod(config))
        real.kubectl("wait", "-n", ns, "--for=condition=Ready", "pod/gateway", "--timeout=120s", timeout=150)
        workers = {
            p["metadata"]["name"]: instance_id(real, ns, p["metadata"]["name"])
            for p in real.pods(ns, f"{COMPONENT_TYPE}=worker")
        }
        yield g, workers
    except BaseException:
        print(real.explain(ns))
        raise
    finally:
        real.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def envoy_pod(config: str) -> list[dict[str, object]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "gateway-envoy"},
            "data": {"envoy.yaml": config},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "gateway", "labels": {"app": "gateway"}},
            "spec": {
                "containers": [
                    {
                        "name": "envoy",
                        "image": realnode.ENVOY_IMAGE,
                        "imagePullPolicy": "Never",
                        "args": ["-c", "/etc/envoy/envoy.yaml", "--disable-hot-restart", "-l", "warning"],
                        "ports": [{"name": "http", "containerPort": GATEWAY_PORT}],
                        "readinessProbe": {"tcpSocket": {"port": GATEWAY_PORT}, "periodSeconds": 1},
                        "volumeMounts": [{"name": "config", "mountPath": "/etc/envoy"}],
                    }
                ],
                "volumes": [{"name": "config", "configMap": {"name": "gateway-envoy"}}],
            },
        },
    ]


def instance_id(real: Real, ns: str, pod: str) -> str:
    ready = wait_until(
        lambda: re.search(
            r"Worker ready instance_id=(\S+)", real.kubectl("logs", "-n", ns, pod, check=False)
        ),
        f"{pod} to log 'Worker ready instance_id='",
        timeout_s=60,
        interval_s=1,
    )
    return ready.group(1)


def scrape(real: Real, ns: str, pod: str, port: int) -> str:
    return real.kubectl("get", "--raw", f"/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/metrics")


def total(text: str, name: str, labels: str = "") -> float:
    """The sum of ``name``'s samples whose labels contain ``labels``."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and labels in line
    )


def picks(real: Real, ns: str) -> dict[str, float]:
    """``dynamo_epp_worker_picks_total`` by worker instance id, read from the picker pod."""
    (epp,) = real.pods(ns, f"{COMPONENT_TYPE}=epp")
    text = scrape(real, ns, epp["metadata"]["name"], 9090)
    out: dict[str, float] = {}
    for worker, value in re.findall(
        r'^dynamo_epp_worker_picks_total\{[^}]*worker="([^"]+)"[^}]*\} (\S+)$', text, re.M
    ):
        out[worker] = out.get(worker, 0.0) + float(value)
    return out


def test_requests_through_envoy_run_on_the_workers_the_picker_named(
    real: Real, gateway: tuple[graphs.Graph, dict[str, str]]
) -> None:
    g, workers = gateway
    try:
        _through_envoy(real, g.namespace, workers)
    except BaseException:
        print(real.explain(g.namespace))
        raise


def _through_envoy(real: Real, ns: str, workers: dict[str, str]) -> None:
    before = picks(real, ns)
    turns: list[str] = []  # the worker each turn of one conversation ran on
    with port_forward(ns, "pod/gateway", GATEWAY_PORT) as port:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=60, max_retries=0
        )
        messages = [{"role": "system", "content": "You answer questions about routing. " * 40}]
        for turn in range(4):
            messages.append({"role": "user", "content": f"Turn {turn}: where did this go?"})
            seen = picks(real, ns)
            r = client.chat.completions.create(model=graphs.MODEL, messages=messages, max_tokens=8)  # type: ignore[arg-type]
            assert r.choices[0].message.content
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
            now = picks(real, ns)
            named = [w for w in now if now[w] > seen.get(w, 0.0)]
            assert len(named) == 1, f"turn {turn}: the picker's counts moved for {named}, not one worker"
            turns.append(named[0])
        for i in range(8):
            chunks = list(
                client.chat.completions.create(
                    model=graphs.MODEL,
                    messages=[{"role": "user", "content": f"Stream {i} {uuid.uuid4().hex}"}],
                    max_tokens=8,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert len(set(turns)) == 1, f"a conversation's turns ran on several workers: {turns}"
    after = picks(real, ns)
    chosen = {w: after.get(w, 0.0) - before.get(w, 0.0) for w in workers.values()}
    served = {iid: graphs.worker_requests(real, ns, pod) for pod, iid in workers.items()}
    assert sum(chosen.values()) == 12 and chosen == served, (chosen, served)
    frontends = [p["metadata"]["name"] for p in real.pods(ns, f"{COMPONENT_TYPE}=frontend")]
    texts = {f: scrape(real, ns, f, 8000) for f in frontends}
    assert all("dynamo_frontend_direct_fallbacks_total{" not in t for t in texts.values())
    carried = {f: total(t, "dynamo_frontend_requests_total", 'endpoint="chat"') for f, t in texts.items()}
    assert sum(carried.values()) == 12, carried
    print({"worker picks": chosen, "frontend requests": carried, "conversation on": turns[0]})
