"""A rolling change of ``--page-size`` on a disaggregated graph serves every request, and never pairs
a prefill and a decode worker of different revisions.

What is real: the kube-apiserver, controller-manager (the Deployment controller rolls the pods) and
scheduler, the operator, nats-server, the frontend and the mocker workers (each a process started from
the pod the operator rendered, by ``tests.support.kubelet``, which reports their readiness as a kubelet
does: readinessProbe, readiness gates), and the clients (the official openai client, no retries).
The mocker refuses a KV handover between different layouts (as SGLang would produce garbage or hang),
so a mixed pair would fail a request. Asserted: zero failed requests over the whole rollout, and none
that waited for a worker (the frontend's own view: some revision had both roles registered at every
moment); during it the graph is not Ready and its state not successful; at the end every pod is of the
new revision and the graph is Ready. The pods' Ready conditions in the API are sampled and printed, not
asserted: they follow the workers' registration at the pace of the test kubelet's status reports, so
on a busy machine the API can briefly show the new prefill Ready and the new decode not yet, while the
frontend already pairs them."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from dataclasses import dataclass, field

import aiohttp
import openai
import pytest
import yaml
from dynamo_operator.render.revision import REVISION_LABEL

from tests.integration.operator.conftest import EXAMPLES, Kubectl, wait_until
from tests.support.kubelet import LocalKubelet
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

GRAPH = "rollout"
MODEL = "Qwen/Qwen3-0.6B"
COMPONENT = "nvidia.com/dynamo-component"


def graph_on(kubelet: LocalKubelet, page_size: int) -> dict:
    """examples/disagg.yaml on the test kubelet's node, with the mocker as engine."""
    graph = yaml.safe_load((EXAMPLES / "disagg.yaml").read_text())
    graph["metadata"] = {"name": GRAPH}
    graph["spec"]["envs"] = [
        {"name": "DYN_HTTP_HOST", "value": "127.0.0.1"},
        {"name": "DYN_LISTEN_HOST", "value": "127.0.0.1"},
        {"name": "DYN_GRACEFUL_SHUTDOWN_S", "value": "5"},
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
    return graph


@dataclass
class Load:
    """Clients sending short completions back to back until stopped; every outcome is kept."""

    url: str
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def client(self) -> None:
        async with openai.AsyncOpenAI(base_url=self.url + "/v1", api_key="-", max_retries=0, timeout=60) as c:
            while not self.stop.is_set():
                try:
                    out = await c.completions.create(
                        model=MODEL, prompt="The rollout", max_tokens=8, extra_body={"ignore_eos": True}
                    )
                    assert out.choices[0].finish_reason == "length", out
                    self.ok += 1
                except (openai.APIError, AssertionError) as e:
                    self.failed.append(repr(e)[:300])


def pods_by_revision(kc: Kubectl) -> dict[str, dict[str, int]]:
    """Ready prefill and decode pods per revision label, of the pods not being deleted:
    {revision: {service: ready pods}}."""
    out: dict[str, dict[str, int]] = {}
    for pod in kc.list("pods"):
        meta_labels = pod["metadata"].get("labels") or {}
        service, revision = meta_labels.get(COMPONENT), meta_labels.get(REVISION_LABEL)
        if (
            service not in ("prefill", "decode")
            or revision is None
            or pod["metadata"].get("deletionTimestamp")
        ):
            continue
        conds = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions") or []}
        ready = conds.get("Ready") == "True"
        out.setdefault(revision, {}).setdefault(service, 0)
        out[revision][service] += int(ready)
    return out


async def _metrics(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as r:
        return await r.text()


def _waits(metrics: str) -> dict[str, float]:
    """From the frontend's dynamo_frontend_queue_wait_seconds histogram: how many requests were
    admitted, and how many of them waited more than 1 ms."""

    def sample(suffix: str, extra: str = "") -> float:
        found = re.search(
            rf'^dynamo_frontend_queue_wait_seconds_{suffix}{{{extra}model="{re.escape(MODEL)}"}} (\S+)$',
            metrics,
            re.M,
        )
        return float(found.group(1)) if found else 0.0

    count = sample("count")
    return {"count": count, "over_1ms": count - sample("bucket", 'le="0.001",')}


def paired(counts: dict[str, dict[str, int]]) -> set[str]:
    return {rev for rev, by in counts.items() if by.get("prefill", 0) > 0 and by.get("decode", 0) > 0}


async def test_a_rolling_page_size_change_serves_every_request(
    kc, operator_factory, nats_url, kube_cluster, tmp_path
):
    operator_factory("--nats-url", nats_url, "--not-ready-recheck-s", "1")
    kubelet = LocalKubelet(kube_cluster.kubeconfig, kc.namespace, tmp_path / "pods").start()
    try:
        await _rollout(kc, kubelet)
    except BaseException:
        logs = kubelet.logs()
        sys.stderr.write("".join(f"--- {name} ---\n{text[-1500:]}\n" for name, text in sorted(logs.items())))
        raise
    finally:
        kubelet.stop()


async def _rollout(kc: Kubectl, kubelet: LocalKubelet) -> None:
    kc.apply(graph_on(kubelet, page_size=16))
    await asyncio.to_thread(kc.wait_ready, GRAPH, 120)
    before = paired(pods_by_revision(kc))
    assert len(before) == 1, before

    port = kubelet.local_port(f"{GRAPH}-frontend", 8000)
    assert port is not None
    load = Load(f"http://127.0.0.1:{port}")
    clients = [asyncio.create_task(load.client()) for _ in range(4)]
    try:
        await wait_until_async(lambda: load.ok >= 20, "the first 20 requests to be served", timeout_s=60)
        # (the very first requests may have waited for the frontend to load the model's tokenizer)
        waits_before = _waits(await _metrics(load.url))
        new = graph_on(kubelet, page_size=32)
        generation = kc.get("dgd", GRAPH)["metadata"]["generation"]
        kc.apply(new)
        started = time.monotonic()

        samples: list[tuple[float, str, int, set[str]]] = []  # (t, state, observedGeneration, paired)

        def rolled_out() -> bool:
            kubelet.check()
            dgd = kc.get("dgd", GRAPH)
            status = dgd.get("status") or {}
            counts = pods_by_revision(kc)
            observed = status.get("observedGeneration", 0)
            samples.append((time.monotonic() - started, status.get("state", ""), observed, paired(counts)))
            done = set(counts) - before and not (set(counts) & before)
            ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
            return bool(
                done
                and ready.get("status") == "True"
                and observed > generation
                and all(by.get("prefill") and by.get("decode") for by in counts.values())
            )

        await asyncio.to_thread(
            wait_until, rolled_out, "the rollout to finish and the graph to be Ready", 180
        )
        served_during = load.ok
        await wait_until_async(
            lambda: load.ok >= served_during + 20, "20 more requests on the new revision", timeout_s=60
        )
    finally:
        load.stop.set()
        await asyncio.gather(*clients)
    waits = _waits(await _metrics(load.url))

    sys.stderr.write(
        f"\nrollout: {load.ok} requests served, {len(load.failed)} failed; "
        f"samples (t, state, generation, paired): "
        f"{[(round(t, 1), s, g, sorted(p)) for t, s, g, p in samples]}\n"
    )
    assert load.failed == [], load.failed[:5]
    # no request waited for a worker during the rollout: from the frontend's discovery, some revision had
    # both roles registered at every moment (a gap would have held requests, not failed them)
    assert waits["count"] == load.ok and waits["over_1ms"] == waits_before["over_1ms"], (waits_before, waits)
    # once the operator saw the change, the graph did not claim success before the pods had rolled
    rolling = [s for s in samples[:-1] if s[2] > generation]
    assert rolling and all(state != "successful" for _, state, _, _ in rolling), samples
    after = paired(pods_by_revision(kc))
    assert len(after) == 1 and after != before
    assert not any("KV layout mismatch" in text for text in kubelet.logs().values())
    events = kc.events(GRAPH, "RevisionPaired")
    assert any(next(iter(after)) in e["message"] for e in events), [e["message"] for e in events]
