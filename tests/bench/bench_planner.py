"""Benchmark (not a test): the SLA planner against fixed graphs on one traffic pattern.

``python -m tests.bench.bench_planner`` (also scenario ``planner`` of ``make bench``). One open-loop
pattern (long prompts at 2 -> 12 -> 3 req/s, then short prompts with longer outputs at 10 req/s) is
served three times by mocker workers loaded with one profile (a slow test engine, as in
``tests/integration/planner``):

- ``1P:1D``: one prefill and one decode worker, fixed (2 GPUs);
- ``agg``: two aggregated workers, fixed (2 GPUs);
- ``planner``: starts at 1P:1D; the planner (budget 4 GPUs) patches the graph on the local control
  plane and this script plays the kubelet, starting and stopping mocker processes to match.

Printed per side: GPU-seconds used (replicas x time), and SLO attainment: the share of requests
whose TTFT is within 400 ms and whose mean ITL is within 40 ms (the planner's targets), measured by
the client. Figures are this machine's; the comparison is what carries over.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml
from dynamo_worker.profile.sweep import Sweeper, SweepError

from tests.bench.fleet import MODEL, Fleet, Proc
from tests.integration.operator.conftest import OperatorProcess
from tests.support.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[2]
DGD = "dynamographdeployments.v1alpha1.nvidia.com"  # read at the example's version (services by name)
TTFT_S, ITL_S = 0.400, 0.040
BUDGET = 4
INTERVAL_S = 2.0
PROFILE = {
    "model": "bench engine",
    "engine": "mocker",
    "gpu": "none",
    "source": "mocker",
    "note": "a slow engine whose decode ITL rises steeply with batch size",
    "prefill": {"isl": [100, 1000, 4000], "ttft_ms": [25.0, 70.0, 220.0]},
    "decode": {
        "batch_size": [1, 8, 32, 64],
        "context": [128, 1024, 4096],
        "itl_ms": [[20 + 2 * b + 0.001 * b * c for c in (128, 1024, 4096)] for b in (1, 8, 32, 64)],
    },
}
# (seconds, req/s, input tokens, output tokens)
PATTERN = [(8, 2.0, 2000, 4), (12, 12.0, 2000, 4), (10, 3.0, 2000, 4), (14, 10.0, 64, 40)]


@dataclass
class Side:
    name: str
    requests: int = 0
    within_slo: int = 0
    failed: int = 0
    gpu_seconds: float = 0.0
    max_gpus: int = 0

    def line(self) -> str:
        share = self.within_slo / self.requests if self.requests else 0.0
        return (
            f"{self.name:>8}  requests {self.requests:4d}  SLO attainment {share:6.1%}  "
            f"failed {self.failed:3d}  GPU-seconds {self.gpu_seconds:6.1f}  max GPUs {self.max_gpus}"
        )


async def _drive(url: str, side: Side, seed: int) -> None:
    rng = random.Random(seed)
    async with aiohttp.ClientSession() as session:
        sweeper = Sweeper(session, url, MODEL, vocab=(10, 200), seed=seed, timeout_s=120)
        tasks: list[asyncio.Task] = []

        async def one(isl: int, osl: int) -> None:
            try:
                r = await sweeper.one(isl, osl)
            except SweepError:
                side.failed += 1
                return
            ttft = r.tokens[0] - r.start
            itl = (r.tokens[-1] - r.tokens[0]) / (len(r.tokens) - 1) if len(r.tokens) > 1 else 0.0
            side.within_slo += ttft <= TTFT_S and itl <= ITL_S

        for seconds, rate, isl, osl in PATTERN:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                tasks.append(asyncio.create_task(one(isl, osl)))
                side.requests += 1
                await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)


def _fixed(fleet: Fleet, side: Side, modes: list[str], profile: Path) -> None:
    ns = f"bench-planner-{side.name.replace(':', '')}-{uuid.uuid4().hex[:6]}"
    for mode in modes:
        fleet.mocker(ns, mode, "--profile", str(profile), "--context-length", "8192", speedup=1.0)
    fe = fleet.frontend(ns)
    roles: dict[str, int] = {}
    for m in modes:
        role = "agg" if m == "null" else m
        roles[role] = roles.get(role, 0) + 1
    fleet.wait_workers(fe, roles)
    started = time.monotonic()
    asyncio.run(_drive(f"http://127.0.0.1:{fe.ports['http']}", side, seed=1))
    side.gpu_seconds = len(modes) * (time.monotonic() - started)
    side.max_gpus = len(modes)


def _planned(fleet: Fleet, side: Side, profile: Path, workdir: Path) -> None:
    with LocalCluster(workdir / "cluster") as cluster:
        for path in sorted((REPO / "crds").glob("*.yaml")):
            cluster.kubectl("apply", "--server-side", "-f", str(path))
        cluster.kubectl("wait", "--for=condition=Established", "crd/dynamographdeployments.nvidia.com")
        cluster.kubectl("create", "namespace", "bench")
        # the API server stores v1beta1 and converts this v1alpha1 graph through the operator's webhook
        operator = OperatorProcess(cluster.kubeconfig, "bench", workdir / "operator.log", cluster=cluster)
        operator.start(timeout=60)
        try:
            _planned_on(fleet, side, profile, workdir, cluster)
        finally:
            operator.stop()


def _planned_on(fleet: Fleet, side: Side, profile: Path, workdir: Path, cluster: LocalCluster) -> None:
    ns = f"bench-planner-p-{uuid.uuid4().hex[:6]}"
    graph = yaml.safe_load((REPO / "examples" / "disagg-planner.yaml").read_text())
    graph["metadata"] = {"name": "bench", "namespace": "bench"}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(graph))
    fe = fleet.frontend(ns)
    running: dict[str, list[Proc]] = {"prefill": [], "decode": []}
    stop = threading.Event()
    usage = {"gpu_seconds": 0.0, "max": 0}

    def kubelet() -> None:
        last = time.monotonic()
        while not stop.is_set():
            svc = json.loads(cluster.kubectl("get", DGD, "bench", "-n", "bench", "-o", "json"))["spec"][
                "services"
            ]
            now = time.monotonic()
            alive = len(running["prefill"]) + len(running["decode"])
            usage["gpu_seconds"] += alive * (now - last)
            usage["max"] = max(usage["max"], alive)
            last = now
            for role in running:
                want = svc[role].get("replicas", 1)
                while len(running[role]) < want:
                    running[role].append(
                        fleet.mocker(
                            ns, role, "--profile", str(profile), "--context-length", "8192", speedup=1.0
                        )
                    )
                while len(running[role]) > want:
                    running[role].pop().stop(grace_s=3)
            stop.wait(0.3)

    thread = threading.Thread(target=kubelet, daemon=True)
    thread.start()
    fleet.wait_workers(fe, {"prefill": 1, "decode": 1})
    cmd = [
        sys.executable, "-m", "dynamo_worker.planner", "--graph", "bench", "--namespace", "bench",
        "--kubeconfig", str(cluster.kubeconfig), "--profile", str(profile),
        "--metrics-url", f"http://127.0.0.1:{fe.ports['http']}/metrics",
        "--ttft-ms", str(TTFT_S * 1e3), "--itl-ms", str(ITL_S * 1e3),
        "--adjustment-interval-s", str(INTERVAL_S), "--max-gpu-budget", str(BUDGET),
        "--cooldown-s", str(2 * INTERVAL_S), "--metrics-host", "127.0.0.1", "--metrics-port", "0",
    ]  # fmt: skip
    with open(workdir / "planner.log", "wb") as log:
        planner = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        asyncio.run(_drive(f"http://127.0.0.1:{fe.ports['http']}", side, seed=1))
    finally:
        planner.terminate()
        planner.wait(15)
        stop.set()
        thread.join(30)
    side.gpu_seconds, side.max_gpus = usage["gpu_seconds"], usage["max"]


def run(workdir: Path) -> dict[str, dict]:
    profile = workdir / "profile.json"
    workdir.mkdir(parents=True, exist_ok=True)
    profile.write_text(json.dumps(PROFILE))
    sides = [Side("1P:1D"), Side("agg"), Side("planner")]
    print(
        f"\n== planner vs fixed graphs: {len(PATTERN)} phases "
        f"({', '.join(f'{r:g} req/s {i}->{o} for {s}s' for s, r, i, o in PATTERN)}); "
        f"SLO TTFT <= {TTFT_S * 1e3:.0f} ms and mean ITL <= {ITL_S * 1e3:.0f} ms; "
        f"planner budget {BUDGET} GPUs ==",
        flush=True,
    )
    with Fleet(workdir / "fleet") as fleet:
        _fixed(fleet, sides[0], ["prefill", "decode"], profile)
        _fixed(fleet, sides[1], ["null", "null"], profile)
        _planned(fleet, sides[2], profile, workdir)
    for s in sides:
        print(s.line(), flush=True)
    return {s.name: s.__dict__ for s in sides}


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="dynamo-bench-planner-") as tmp:
        run(Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
