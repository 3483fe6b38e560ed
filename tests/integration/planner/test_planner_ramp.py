"""The SLA planner follows a load ramp: long prompts at 2 -> 12 -> 4 req/s, then short prompts with
longer outputs. It scales prefill up and back down, then decode up (cut by its GPU budget of 3), each
within two adjustment intervals of the traffic becoming visible, never past the budget, through its
own graph on a real apiserver with the least-privilege service account the operator rendered for it,
and explains each change as an Event.

What is real: the kube-apiserver, the operator (which renders the planner's ServiceAccount, Role and
RoleBinding), the planner process (authenticated with a token of that ServiceAccount, so a Role that
allowed less would fail the test), nats-server, the frontend and mocker worker processes, HTTP load.
What is simulated: kwok runs the graph's pods as Ready without executing them, so the test plays the
kubelet's part for the workers: it watches the graph's replicas on the apiserver and starts or stops
local mocker processes to match, which closes the loop (more prefill workers really lower TTFT).

The profile: mockers and planner load the same profile file, written here. It is not the shipped H100
profile: on an H100 a second decode replica pays off only at thousands of tokens/s, more than this
CPU-only test machine can stream, so this profile describes a slower engine whose ITL rises steeply
with batch size. What is under test is the control loop (the planner's model of the profile matches
the mocker's timing), not H100 figures.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.integration.operator.conftest import EXAMPLES, Kubectl, wait_until
from tests.support.procs import listening_port
from tests.support.procs import popen as start_process
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

GRAPH = "ramp"
INTERVAL_S = 2.0
BUDGET = 3
TTFT_MS, ITL_MS = 400, 40
PROFILE = {
    "model": "test engine (tiny model)",
    "engine": "mocker",
    "gpu": "none",
    "source": "mocker",
    "note": "test fixture: a slow engine whose decode ITL rises steeply with batch size",
    "prefill": {"isl": [100, 1000, 4000], "ttft_ms": [25.0, 70.0, 220.0]},
    "decode": {
        "batch_size": [1, 8, 32, 64],
        "context": [128, 1024, 4096],
        "itl_ms": [[20 + 2 * b + 0.001 * b * c for c in (128, 1024, 4096)] for b in (1, 8, 32, 64)],
    },
}
# (name, seconds, req/s, input tokens, output tokens)
PHASES = [
    ("low", 8, 2.0, 2000, 4),
    ("long-prompts", 12, 12.0, 2000, 4),
    ("calm", 14, 4.0, 2000, 4),
    ("long-outputs", 14, 12.0, 64, 60),
]


@dataclass
class Trajectory:
    points: list[tuple[float, int, int]] = field(default_factory=list)  # (t, prefill, decode)

    def first(self, after: float, pred) -> float | None:
        return next((t for t, p, d in self.points if t >= after and pred(p, d)), None)


def _replicas(kc: Kubectl) -> tuple[int, int]:
    svc = kc.get("dgd", GRAPH)["spec"]["services"]
    return svc["prefill"].get("replicas", 1), svc["decode"].get("replicas", 1)


async def _kubelet(kc, mockers, profile: Path, traj: Trajectory, t0: float, stop: asyncio.Event):
    """Keep as many local mocker processes per role as the graph asks for (newest stopped first)."""
    running: dict[str, list] = {"prefill": [], "decode": []}
    extra = ("--profile", str(profile), "--context-length", "8192", "--max-running-requests", "64")
    while not stop.is_set():
        p, d = await asyncio.to_thread(_replicas, kc)
        traj.points.append((time.monotonic() - t0, p, d))
        for role, want in (("prefill", p), ("decode", d)):
            while len(running[role]) < want:
                running[role].append(mockers(role, *extra, speedup=1.0))
            while len(running[role]) > want:
                await asyncio.to_thread(running[role].pop().stop)
        await asyncio.sleep(0.3)


async def _load(url: str, traj_t0: float, marks: dict[str, float], results: list[tuple[str, int]]):
    """Open-loop Poisson arrivals per phase; prompts are token ids (no tokenizer cost)."""
    rng = random.Random(7)
    tasks: set[asyncio.Task] = set()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:

        async def one(phase: str, isl: int, osl: int) -> None:
            body = {
                "model": "tiny",
                "prompt": [rng.randrange(10, 200) for _ in range(isl)],
                "max_tokens": osl,
                "ignore_eos": True,
            }
            try:
                async with http.post(url + "/v1/completions", json=body) as r:
                    await r.read()
                    results.append((phase, r.status))
            except (aiohttp.ClientError, TimeoutError):
                results.append((phase, 0))

        for name, seconds, rate, isl, osl in PHASES:
            start = time.monotonic()
            marks[name] = start - traj_t0
            due = start  # arrivals on an absolute schedule: a busy loop catches up instead of slowing down
            while due - start < seconds:
                await asyncio.sleep(max(due - time.monotonic(), 0))
                t = asyncio.create_task(one(name, isl, osl))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
                due += rng.expovariate(rate)
        await asyncio.gather(*tasks)


def _spawn(cmd: list[str], log_path: Path) -> subprocess.Popen:
    with open(log_path, "wb") as out:
        return start_process(cmd, stdout=out, stderr=subprocess.STDOUT)


async def _wait_roles(url: str, frontend: subprocess.Popen, expected: dict[str, int], within_s: float = 60):
    """Until the frontend's ``dynamo_frontend_workers`` gauge shows the expected workers per role."""
    seen: dict[str, float] = {}
    async with aiohttp.ClientSession() as http:

        async def enough() -> bool:
            nonlocal seen
            assert frontend.poll() is None, f"the frontend exited with {frontend.returncode}"
            try:
                async with http.get(url + "/metrics") as r:
                    text = await r.text()
                seen = {
                    line.split('role="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith("dynamo_frontend_workers{")
                }
                return all(seen.get(role, 0) >= n for role, n in expected.items())
            except aiohttp.ClientError:
                return False

        await wait_until_async(
            enough,
            f"the frontend to see workers {expected}",
            timeout_s=within_s,
            interval_s=0.2,
            explain=lambda: f"it saw {seen}",
        )


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_planner_follows_a_load_ramp_within_budget(
    kc, operator, mockers, namespace, nats_url, tmp_path
):
    graph = yaml.safe_load((EXAMPLES / "disagg-planner.yaml").read_text())
    graph["metadata"]["name"] = GRAPH
    kc.apply(graph)
    kc.wait_ready(GRAPH)
    account = f"{GRAPH}-planner"
    role = kc.get("role", account)
    assert role["rules"][0]["resourceNames"] == [GRAPH]

    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(PROFILE))
    kubeconfig = kc.service_account_kubeconfig(account, tmp_path / "planner-kubeconfig")
    # the planner's account may patch its own graph, and nothing else
    kc.apply({**graph, "metadata": {"name": "other"}})
    denied = kc.run(
        "auth",
        "can-i",
        "patch",
        "dgd/other",
        f"--as=system:serviceaccount:{kc.namespace}:{account}",
        check=False,
    )
    allowed = kc.run(
        "auth",
        "can-i",
        "patch",
        f"dgd/{GRAPH}",
        f"--as=system:serviceaccount:{kc.namespace}:{account}",
        check=False,
    )
    assert (denied.strip(), allowed.strip()) == ("no", "yes")

    frontend = _spawn(
        [
            sys.executable, "-m", "dynamo_worker.frontend", "--http-host", "127.0.0.1",
            "--http-port", "0", "--namespace", namespace, "--nats-server", nats_url,
        ],
        tmp_path / "frontend.log",
    )  # fmt: skip
    fe_port = await asyncio.to_thread(listening_port, frontend, tmp_path / "frontend.log", "frontend")
    fe_url = f"http://127.0.0.1:{fe_port}"
    t0 = time.monotonic()
    traj = Trajectory()
    stop = asyncio.Event()
    kubelet = asyncio.create_task(_kubelet(kc, mockers, profile, traj, t0, stop))
    try:
        await _wait_roles(fe_url, frontend, {"prefill": 1, "decode": 1})
    except BaseException:
        stop.set()
        await kubelet
        frontend.terminate()
        raise

    log_path = tmp_path / "planner.log"
    cmd = [
        sys.executable, "-m", "dynamo_worker.planner",
        "--graph", GRAPH, "--namespace", kc.namespace, "--kubeconfig", str(kubeconfig),
        "--profile", str(profile), "--metrics-url", f"{fe_url}/metrics",
        "--config", json.dumps({
            "environment": "kubernetes", "backend": "sglang", "optimization_target": "sla",
            "ttft": TTFT_MS, "itl": ITL_MS, "adjustment_interval": INTERVAL_S,
            "max_gpu_budget": BUDGET, "min_endpoint": 1, "no_correction": True,
        }),
        "--cooldown-s", str(2 * INTERVAL_S), "--down-stable-intervals", "2",
        "--metrics-host", "127.0.0.1", "--metrics-port", "0",
    ]  # fmt: skip
    planner = _spawn(cmd, log_path)
    marks: dict[str, float] = {}
    results: list[tuple[str, int]] = []
    try:
        wait_until(lambda: kc.events(GRAPH, "PlannerStarted"), "the planner's PlannerStarted Event", 30)
        await _load(fe_url, t0, marks, results)
        metrics_port = await asyncio.to_thread(listening_port, planner, log_path, "planner-metrics")
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
            planner_metrics = await r.text()
    finally:
        stop.set()
        await kubelet
        planner.terminate()
        planner.wait(15)
        frontend.terminate()
        frontend.wait(15)
        sys.stderr.write(f"--- planner log ---\n{log_path.read_text()[-6000:]}\n")

    sys.stderr.write(f"trajectory (t, prefill, decode) changes: {_changes(traj)}\nphases: {marks}\n")
    # never past the budget (1 GPU per replica of each role)
    assert max(p + d for _, p, d in traj.points) <= BUDGET
    # the phase with long prompts at 12 req/s: prefill up (2 replicas carry it within TTFT 400 ms)
    lag = 3 * INTERVAL_S + 2.0  # the interval in progress, two more, and a request's own duration
    up = traj.first(marks["long-prompts"], lambda p, d: p >= 2)
    assert up is not None and up - marks["long-prompts"] <= lag, _changes(traj)
    # calm again: prefill back down (after the hysteresis: two lower intervals and the cool-down)
    down = traj.first(marks["calm"], lambda p, d: p == 1)
    assert down is not None and down - marks["calm"] <= lag + 2 * INTERVAL_S, _changes(traj)
    # short prompts, long outputs: decode up (it wants 3; the budget leaves 2), prefill stays down
    dec = traj.first(marks["long-outputs"], lambda p, d: d >= 2)
    assert dec is not None and dec - marks["long-outputs"] <= lag + 2.0, _changes(traj)
    assert all(p == 1 for t, p, _ in traj.points if t >= dec)
    # each change was explained; the budget cut was named
    scaled = [e["message"] for e in kc.events(GRAPH, "Scaled")]
    assert any("prefill prefill 1 -> " in m for m in scaled), scaled
    # 12 req/s x 60 tokens wants 4 decode replicas: the budget cut is named in the decisions
    assert f"budget {BUDGET} GPUs < " in log_path.read_text()
    assert any("decode decode 1 -> " in m for m in scaled), scaled
    ignored = kc.events(GRAPH, "ConfigFieldsIgnored")
    assert ignored and "no_correction" in ignored[0]["message"]
    # the planner's metrics: desired vs current, predicted vs observed. At the end prefill holds its
    # target; decode, cut by the budget, is predicted above its target (and says so, not hides it)
    assert _metric(planner_metrics, "planner_replicas") is not None
    assert _metric(planner_metrics, "planner_gpu_budget") == BUDGET
    predicted_ttft = _metric(planner_metrics, "planner_predicted_ttft_seconds")
    assert predicted_ttft is not None and predicted_ttft <= TTFT_MS / 1e3
    assert _metric(planner_metrics, "planner_predicted_itl_seconds") is not None
    assert _metric(planner_metrics, "planner_observed_itl_seconds") is not None
    errors = [r for r in results if r[1] != 200]
    sys.stderr.write(f"requests: {len(results)}, not 200: {len(errors)}\n")


def _changes(traj: Trajectory) -> list[tuple[float, int, int]]:
    out, last = [], None
    for t, p, d in traj.points:
        if (p, d) != last:
            out.append((round(t, 1), p, d))
            last = (p, d)
    return out
