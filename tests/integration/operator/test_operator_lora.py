"""DynamoModels on a disaggregated graph: the operator loads each adapter on every prefill and decode
worker as pods come and go, reloads it from a new source, and unloads it when the model is deleted; a
bad source or a rank above --max-lora-rank is a condition and an Event naming the fix; a rollout keeps
serving adapter requests.

What is real: the kube-apiserver, controller-manager (Deployments roll the pods) and scheduler, the
operator, nats-server, the frontend and the mocker workers (each a process started from the pod the
operator rendered, by ``tests.support.kubelet``: readiness from the probe and the readiness gates, and
each pod at an address of its own, where the operator reaches its system port as in a cluster), the
adapters (PEFT folders, ``tests.support.peft_adapters``) and the clients (the official openai client,
no retries)."""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.integration.operator.conftest import EXAMPLES, Kubectl, condition_of, wait_until
from tests.support.cluster import ClusterError
from tests.support.kubelet import LocalKubelet
from tests.support.manifests import graph_of
from tests.support.peft_adapters import write_adapter
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

GRAPH = "lora"
BASE = "Qwen/Qwen3-0.6B"
COMPONENT = "nvidia.com/dynamo-component"
# The mocker takes this long to load an adapter (SGLang reads its weights from disk): long enough that a
# new pod serving before it holds the adapter would leave requests for it without a worker.
LOAD_MS = 2000


def graph_on(kubelet: LocalKubelet, page_size: int = 16, grace_s: int = 1) -> dict:
    """examples/lora-disagg.yaml's graph on the test kubelet's node, with the mocker as engine; its workers
    drain ``grace_s`` on SIGTERM (a rollout's old pods serve their running requests to the end)."""
    graph = graph_of(EXAMPLES / "lora-disagg.yaml")
    graph["metadata"] = {"name": GRAPH}
    graph["spec"]["envs"] = [
        {"name": "DYN_HTTP_HOST", "value": "127.0.0.1"},
        {"name": "DYN_LISTEN_HOST", "value": "127.0.0.1"},
        {"name": "DYN_GRACEFUL_SHUTDOWN_S", "value": str(grace_s)},
    ]
    for name, service in graph["spec"]["services"].items():
        extra = service.setdefault("extraPodSpec", {})
        extra.update(kubelet.placement())
        if name == "Frontend":
            continue
        main = extra["mainContainer"]
        main["command"] = ["python3", "-m", "dynamo_worker.mocker"]
        args = main["args"]
        args[args.index("--page-size") + 1] = str(page_size)
        args += ["--lora-load-ms", str(LOAD_MS)]
    return graph


def dynamo_model(name: str, uri: str) -> dict:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoModel",
        "metadata": {"name": name},
        "spec": {"modelName": name, "baseModelName": BASE, "modelType": "lora", "source": {"uri": uri}},
    }


@pytest.fixture
def adapters(tmp_path: Path) -> dict[str, str]:
    from dynamo_worker.tinymodel import ensure_tiny_model

    model = ensure_tiny_model(tmp_path / "tiny")
    made = {
        "support": write_adapter(model, tmp_path / "support", rank=8, seed=1),
        "sql": write_adapter(model, tmp_path / "sql", rank=16, seed=2),
        "huge": write_adapter(model, tmp_path / "huge", rank=64, seed=3),
    }
    return {name: f"file://{path}" for name, path in made.items()}


@pytest.fixture
def served(
    kc: Kubectl, operator_factory, nats_url: str, kube_cluster, tmp_path: Path
) -> Iterator[LocalKubelet]:
    """The operator and a test kubelet for the graph. At the end the models are deleted while the operator
    still runs (it removes their finalizers; a namespace left with one would never finish deleting), and
    the pods' log tails are printed (pytest shows them when the test failed)."""
    operator_factory("--nats-url", nats_url, "--not-ready-recheck-s", "1")
    kubelet = LocalKubelet(kube_cluster.kubeconfig, kc.namespace, tmp_path / "pods", pod_network=True).start()
    try:
        yield kubelet
    finally:
        for dm in kc.list("dynamomodels"):
            kc.run("delete", "dm", dm["metadata"]["name"], "--wait=false", check=False)
        wait_until(lambda: not kc.list("dynamomodels"), "the models to be deleted", 60)
        logs = kubelet.logs()
        sys.stderr.write("".join(f"--- {n} ---\n{t[-1500:]}\n" for n, t in sorted(logs.items())))
        kubelet.stop()


def model(kc: Kubectl, name: str) -> dict | None:
    return kc.get("dm", name)


def ready(kc: Kubectl, name: str) -> dict | None:
    obj = model(kc, name)
    cond = condition_of(obj)
    return obj if cond and cond["status"] == "True" else None


def held(endpoint: dict) -> list[str]:
    """What the worker at a status endpoint lists on GET /v1/loras."""
    with urllib.request.urlopen(endpoint["address"] + "/v1/loras", timeout=5) as r:
        return sorted(a["lora_name"] for a in json.loads(r.read())["loras"])


def sources(endpoint: dict) -> dict[str, str]:
    """Each adapter the worker at a status endpoint holds, and where it was loaded from."""
    with urllib.request.urlopen(endpoint["address"] + "/v1/loras", timeout=5) as r:
        return {a["lora_name"]: a["uri"] for a in json.loads(r.read())["loras"]}


def worker_pods(kc: Kubectl) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in kc.list("pods")
        if (p["metadata"].get("labels") or {}).get(COMPONENT) in ("prefill", "decode")
        and not p["metadata"].get("deletionTimestamp")
    )


def client(kubelet: LocalKubelet) -> openai.OpenAI:
    port = kubelet.local_port(f"{GRAPH}-frontend", 8000)
    assert port is not None
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0, timeout=30)


def complete(kubelet: LocalKubelet, model_name: str) -> str:
    with client(kubelet) as c:
        out = c.completions.create(
            model=model_name, prompt="Hello", max_tokens=4, extra_body={"ignore_eos": True}
        )
    assert out.usage is not None and out.usage.completion_tokens == 4
    return out.choices[0].text


def test_models_reach_ready_follow_the_pods_and_unload_when_deleted(
    kc: Kubectl, served: LocalKubelet, adapters
):
    kubelet = served
    kc.apply(graph_on(kubelet))
    kc.apply(dynamo_model("support", adapters["support"]))
    kc.apply(dynamo_model("sql", adapters["sql"]))
    kc.wait_ready(GRAPH, 120)
    for name in ("support", "sql"):
        kc.run("wait", "--for=condition=Ready", f"dm/{name}", "--timeout=60s")
        obj = model(kc, name)
        assert obj is not None
        status = obj["status"]
        assert (status["totalEndpoints"], status["readyEndpoints"]) == (2, 2), status
        assert sorted(e["podName"] for e in status["endpoints"]) == worker_pods(kc)
        assert all(held(e) == ["sql", "support"] for e in status["endpoints"])
        assert condition_of(obj, "EndpointsReady")["reason"] == "AllEndpointsReady"
        assert condition_of(obj, "ServicesFound")["message"].startswith(
            f"Found {GRAPH}/decode, {GRAPH}/prefill"
        )
        assert obj["metadata"]["finalizers"] == ["nvidia.com/dynamo-model-unload"]
        assert kc.events(name, "EndpointsReady") and kc.events(name, "LoRALoaded")
    columns = kc.run("get", "dm", "support").splitlines()
    assert columns[0].split() == ["NAME", "TOTAL", "READY", "AGE"] and columns[1].split()[:3] == [
        "support",
        "2",
        "2",
    ]
    assert complete(kubelet, "support") and complete(kubelet, f"{BASE}:sql")

    # a new decode pod gets both adapters; the model counts it
    kc.patch("dgd", GRAPH, {"spec": {"services": {"decode": {"replicas": 2}}}})

    def three() -> dict | None:
        found = [ready(kc, name) for name in ("sql", "support")]
        return found[0] if all(m and m["status"]["totalEndpoints"] == 3 for m in found) else None

    scaled = wait_until(three, "a third endpoint holding both adapters", 90)
    assert all(held(e) == ["sql", "support"] for e in scaled["status"]["endpoints"])
    kc.wait_ready(GRAPH, 90)

    # deleting a model unloads it from every worker; requests for it get 404, the other is served on
    endpoints = scaled["status"]["endpoints"]
    kc.delete("dm", "sql", "--wait=true", "--timeout=60s")
    assert all(held(e) == ["support"] for e in endpoints)
    with client(kubelet) as c, pytest.raises(openai.NotFoundError):
        c.completions.create(model="sql", prompt="Hello", max_tokens=4)
    assert complete(kubelet, "support")
    assert kc.events("sql", "LoRAUnloaded")

    # a new source.uri is loaded on every worker in place of the old one
    kc.apply(dynamo_model("support", adapters["sql"]))

    def reloaded() -> bool:
        obj = ready(kc, "support")
        return bool(obj) and all(
            sources(e) == {"support": adapters["sql"]} for e in obj["status"]["endpoints"]
        )

    wait_until(reloaded, "every worker to hold support from its new source")
    assert any(
        e["message"].startswith("Reloaded adapter support") for e in kc.events("support", "LoRALoaded")
    )


def test_a_missing_or_bad_source_and_a_rank_above_the_workers_are_refused_with_the_fix(
    kc: Kubectl, served: LocalKubelet, adapters, tmp_path
):
    # without its files, the API server refuses it (the CRD's rule), with the fix
    sourceless = dynamo_model("nothing", "")
    del sourceless["spec"]["source"]
    with pytest.raises(ClusterError, match=r"needs spec\.source\.uri .*set it, or set modelType: base"):
        kc.apply(sourceless)
    kc.apply(graph_on(served))
    kc.wait_ready(GRAPH, 120)
    kc.apply(dynamo_model("huge", adapters["huge"]))
    kc.apply(dynamo_model("missing", f"file://{tmp_path}/no-such-adapter"))

    def refused(name: str, reason: str) -> dict | None:
        cond = condition_of(model(kc, name))
        return cond if cond and (cond["status"], cond["reason"]) == ("False", reason) else None

    huge = wait_until(lambda: refused("huge", "RankTooLarge"), "huge to be refused: RankTooLarge")
    assert "0/2 endpoints hold adapter huge" in huge["message"] and "--max-lora-rank" in huge["message"]
    missing = wait_until(lambda: refused("missing", "InvalidSource"), "missing to be refused: InvalidSource")
    assert "no-such-adapter" in missing["message"]
    (event,) = wait_until(lambda: kc.events("huge", "RankTooLarge"), "a RankTooLarge Event")
    assert event["type"] == "Warning" and "--max-lora-rank" in event["message"]
    assert condition_of(model(kc, "huge"), "EndpointsReady")["reason"] == "RankTooLarge"
    # the graph is served on: a refused adapter does not hold the pods' LoRA gates
    assert complete(served, BASE)

    # an adapter of the right rank under the same name: the model becomes Ready (level-triggered)
    kc.apply(dynamo_model("huge", adapters["support"]))
    wait_until(lambda: ready(kc, "huge"), "huge Ready once its source fits")


def test_a_rollout_keeps_serving_adapter_requests(kc: Kubectl, served: LocalKubelet, adapters):
    kubelet = served
    kc.apply(graph_on(kubelet, page_size=16, grace_s=5))
    kc.apply(dynamo_model("support", adapters["support"]))
    kc.wait_ready(GRAPH, 120)
    kc.run("wait", "--for=condition=Ready", "dm/support", "--timeout=60s")
    before = set(worker_pods(kc))
    asyncio.run(_serve_through_rollout(kc, kubelet, before))
    after = ready(kc, "support")
    assert after is not None and {e["podName"] for e in after["status"]["endpoints"]}.isdisjoint(before)
    events = kc.events(GRAPH, "LorasLoaded")
    assert events, "the new pods' LoRA gates were opened"


async def _serve_through_rollout(kc: Kubectl, kubelet: LocalKubelet, before: set[str]) -> None:
    port = kubelet.local_port(f"{GRAPH}-frontend", 8000)
    ok, failed = [0], []
    stop = asyncio.Event()

    async def load() -> None:
        async with openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0, timeout=60
        ) as c:
            while not stop.is_set():
                try:
                    out = await c.completions.create(
                        model="support", prompt="The rollout", max_tokens=4, extra_body={"ignore_eos": True}
                    )
                    assert out.choices[0].finish_reason == "length", out
                    ok[0] += 1
                except (openai.APIError, AssertionError) as e:
                    failed.append(repr(e)[:300])

    clients = [asyncio.create_task(load()) for _ in range(3)]
    try:
        await wait_until_async(lambda: ok[0] >= 10, "the first 10 adapter requests", timeout_s=60)
        kc.apply(graph_on(kubelet, page_size=32, grace_s=5))  # a new revision of both roles

        def rolled() -> bool:
            kubelet.check()
            pods = set(worker_pods(kc))
            dm = ready(kc, "support")
            return bool(
                pods and pods.isdisjoint(before) and dm and dm["status"]["totalEndpoints"] == len(pods)
            )

        await asyncio.to_thread(wait_until, rolled, "the new revision to serve the adapter alone", 180)
        served_during = ok[0]
        await wait_until_async(
            lambda: ok[0] >= served_during + 10, "10 more on the new revision", timeout_s=60
        )
    finally:
        stop.set()
        await asyncio.gather(*clients)
    sys.stderr.write(f"\nrollout: {ok[0]} adapter requests served, {len(failed)} failed\n")
    assert failed == [], failed[:5]
