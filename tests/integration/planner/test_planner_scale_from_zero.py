"""Scale from zero: a disaggregated graph at 0 prefill and 0 decode replicas keeps its model listed; a
request that arrives is held by the frontend, which says there is demand
(``dynamo_frontend_queued_requests``); the planner reads it and sets both roles to 1 at once (not after
an adjustment interval of 30 s); the pods start, their workers register, and the held request is
answered.

What is real: the kube-apiserver, controller-manager and scheduler, the operator (which renders the
frontend with the graph's models and the planner's least-privilege ServiceAccount), the planner process
(authenticated as that ServiceAccount), nats-server, the frontend and mocker workers (each a process
started from the pod the operator rendered, by ``tests.support.kubelet``) and the official openai client.
The planner's own pod lands on a kwok node and runs nothing: the test runs the planner itself, with a
token of its account, because the test kubelet mounts no ServiceAccount token."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import openai
import pytest
import yaml

from tests.integration.operator.conftest import EXAMPLES, Kubectl, wait_until
from tests.support.kubelet import LocalKubelet
from tests.support.procs import popen

pytestmark = pytest.mark.integration

GRAPH = "zero"
MODEL = "Qwen/Qwen3-0.6B"
INTERVAL_S = 30  # far longer than the test: a scale-up from zero must not wait for it


def graph_at_zero(kubelet: LocalKubelet) -> dict:
    """examples/disagg-planner.yaml at 0 prefill and 0 decode replicas, its frontend and workers on the
    test kubelet's node, the mocker as engine."""
    graph = yaml.safe_load((EXAMPLES / "disagg-planner.yaml").read_text())
    graph["metadata"] = {"name": GRAPH}
    graph["spec"]["envs"] = [
        {"name": "DYN_HTTP_HOST", "value": "127.0.0.1"},
        {"name": "DYN_LISTEN_HOST", "value": "127.0.0.1"},
    ]
    for name, service in graph["spec"]["services"].items():
        if name == "Planner":
            continue
        extra = service.setdefault("extraPodSpec", {})
        extra.update(kubelet.placement())
        if name in ("prefill", "decode"):
            service["replicas"] = 0
            extra["mainContainer"]["command"] = ["python3", "-m", "dynamo_worker.mocker"]
    return graph


def _spawn(cmd: list[str], log_path) -> subprocess.Popen:
    with open(log_path, "wb") as out:
        return popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def replicas(kc: Kubectl) -> tuple[int, int]:
    services = kc.get("dgd", GRAPH)["spec"]["services"]
    return services["prefill"].get("replicas", 1), services["decode"].get("replicas", 1)


async def test_a_held_request_scales_the_graph_from_zero_and_is_answered(
    kc, operator_factory, nats_url, kube_cluster, tmp_path
):
    operator_factory("--nats-url", nats_url, "--not-ready-recheck-s", "1")
    kubelet = LocalKubelet(kube_cluster.kubeconfig, kc.namespace, tmp_path / "pods").start()
    planner: subprocess.Popen | None = None
    planner_log = tmp_path / "planner.log"
    try:
        kc.apply(graph_at_zero(kubelet))
        await asyncio.to_thread(kc.wait_ready, GRAPH, 120)
        assert replicas(kc) == (0, 0)
        port = kubelet.local_port(f"{GRAPH}-frontend", 8000)
        assert port is not None
        url = f"http://127.0.0.1:{port}"
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=120) as c:
            assert [m.id async for m in c.models.list()] == [MODEL]  # at 0 replicas, still listed

            kubeconfig = kc.service_account_kubeconfig(f"{GRAPH}-planner", tmp_path / "planner-kubeconfig")
            config = {
                "environment": "kubernetes", "backend": "sglang", "optimization_target": "sla",
                "ttft": 500, "itl": 20, "adjustment_interval": INTERVAL_S, "min_endpoint": 0,
            }  # fmt: skip
            cmd = [
                sys.executable, "-m", "dynamo_worker.planner", "--graph", GRAPH, "--namespace", kc.namespace,
                "--kubeconfig", str(kubeconfig), "--profile", "builtin:sglang-8b-h100",
                "--metrics-url", f"{url}/metrics", "--config", json.dumps(config),
                "--metrics-host", "127.0.0.1", "--metrics-port", "0",
            ]  # fmt: skip
            planner = await asyncio.to_thread(_spawn, cmd, planner_log)
            await asyncio.to_thread(
                wait_until, lambda: kc.events(GRAPH, "PlannerStarted"), "the planner to start", 60
            )
            assert replicas(kc) == (0, 0)  # no demand yet: zero stays zero

            arrived = time.monotonic()
            out = await c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Wake up"}], max_tokens=8
            )
            latency = time.monotonic() - arrived
            assert out.choices[0].message.content
        kubelet.check()
        assert replicas(kc) == (1, 1)
        scaled = [e["message"] for e in kc.events(GRAPH, "Scaled")]
        assert any("prefill prefill 0 -> 1" in m and "decode decode 0 -> 1" in m for m in scaled), scaled
        sys.stderr.write(
            f"\nscale from zero (planner, operator, pods by the test kubelet, mocker): request arrival "
            f"to answer {latency:.2f}s\n"
        )
        assert latency < INTERVAL_S  # it did not wait for an adjustment interval
    except BaseException:
        logs = {**kubelet.logs(), "planner": planner_log.read_text() if planner_log.exists() else ""}
        sys.stderr.write("".join(f"--- {name} ---\n{text[-2000:]}\n" for name, text in sorted(logs.items())))
        raise
    finally:
        if planner is not None:
            planner.terminate()
            planner.wait(15)
        kubelet.stop()
