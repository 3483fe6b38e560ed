"""Benchmark (not a test): how the operator scales with the number of graphs.

    .venv/bin/python -m tests.bench.bench_operator [--k 1 10 50] [--timeout 300] [--json-out FILE]

Starts the local control plane (kube-apiserver, etcd, controller-manager, scheduler, kwok with fake
GPU nodes; ``tests.support.cluster``) unless ``--kubeconfig`` points at a running one, installs the
CRD, and for each K: starts a fresh operator process (``python -m dynamo_operator``) scoped to a fresh
namespace, creates K copies of ``examples/agg.yaml`` (frontend + 1-GPU worker each: 2 Deployments
and a Service per graph, 2 pods), and measures from the first create:

- created: until the K DynamoGraphDeployments are created (one POST each, sequential: the client's
  and the API server's share, not the operator's);
- children: until every graph's Deployments and Service exist;
- pods ready: until every Deployment has all its pods ready (the control plane's and kwok's share);
- DGDs Ready: until every graph reports ``Ready=True`` (the lag after "pods ready" is the operator's);
- the operator process's CPU time (user + system, from /proc) and peak RSS (VmHWM) over the run.

The bench adds one more kwok node (``bench-gpu-big``, 256 GPUs, 600 pods) so that every graph's pods
can be scheduled up to K = 250. Numbers depend on this machine (2 shared cores, the control plane
on the same cores); compare ratios between K.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from dynamo_worker.runtime.nats_server import free_port

from tests.support.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[2]
CLK_TCK = os.sysconf("SC_CLK_TCK")
BENCH_NODE = "bench-gpu-big"


@dataclass
class Result:
    k: int
    created_s: float
    children_s: float | None
    pods_ready_s: float | None
    ready_s: float | None
    operator_cpu_s: float
    operator_peak_rss_mib: float


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def start_operator(kubeconfig: Path, namespace: str, log: Path) -> subprocess.Popen:
    port = free_port()
    cmd = [
        sys.executable, "-m", "dynamo_operator", "--namespace", namespace, "--kubeconfig", str(kubeconfig),
        "--liveness-host", "127.0.0.1", "--liveness-port", str(port), "--not-ready-recheck-s", "5",
        # the conversion webhook (the graphs are created at v1alpha1), where this apiserver calls it
        "--webhook-host", "127.0.0.1", "--webhook-port", str(free_port()),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"operator exited with {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"operator not live within 60s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def add_bench_node(cluster: LocalCluster, gpus: int = 256, pods: int = 600) -> None:
    """A big fake GPU node managed by kwok (like the cluster's own nodes), so that K graphs fit."""
    capacity = {
        "cpu": "1024",
        "memory": "4Ti",
        "pods": str(pods),
        "nvidia.com/gpu": str(gpus),
        "rdma/ib": "8",
    }
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": BENCH_NODE,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": BENCH_NODE,
                "nvidia.com/gpu.present": "true",
            },
        },
        "status": {"allocatable": capacity, "capacity": capacity},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(node))
    cluster.kubectl("wait", "--for=condition=Ready", "node", BENCH_NODE, "--timeout=60s")


def run_k(cluster: LocalCluster, k: int, timeout: float, workdir: Path) -> Result:
    namespace = f"bench-operator-{k}-{os.getpid()}"
    cluster.kubectl("create", "namespace", namespace)
    proc = start_operator(cluster.kubeconfig, namespace, workdir / f"operator-{k}.log")
    try:
        return asyncio.run(_measure(cluster, proc, namespace, k, deadline_s=timeout))
    finally:
        stop(proc)
        cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=180s", check=False)


async def _measure(
    cluster: LocalCluster, proc: subprocess.Popen, namespace: str, k: int, *, deadline_s: float
) -> Result:
    from kubernetes_asyncio import client, config

    base = yaml.safe_load((REPO / "examples" / "agg.yaml").read_text())
    api = await config.new_client_from_config(config_file=str(cluster.kubeconfig), persist_config=False)
    custom, apps, core = client.CustomObjectsApi(api), client.AppsV1Api(api), client.CoreV1Api(api)
    cpu0 = cpu_seconds(proc.pid)
    try:
        t0 = time.monotonic()
        for i in range(k):
            body = copy.deepcopy(base)
            body["metadata"] = {"name": f"bench-{i:03d}", "namespace": namespace}
            await custom.create_namespaced_custom_object(
                "nvidia.com", "v1alpha1", namespace, "dynamographdeployments", body
            )
        created_s = time.monotonic() - t0
        children_s = pods_ready_s = ready_s = None
        deadline = t0 + deadline_s
        while time.monotonic() < deadline and ready_s is None:
            deployments = (await apps.list_namespaced_deployment(namespace)).items
            if children_s is None:
                services = len((await core.list_namespaced_service(namespace)).items)
                if len(deployments) >= 2 * k and services >= k:
                    children_s = time.monotonic() - t0
            all_ready = all((d.status.ready_replicas or 0) >= (d.spec.replicas or 0) for d in deployments)
            if children_s is not None and pods_ready_s is None and all_ready:
                pods_ready_s = time.monotonic() - t0
            if pods_ready_s is not None:
                graphs = (
                    await custom.list_namespaced_custom_object(
                        "nvidia.com", "v1alpha1", namespace, "dynamographdeployments"
                    )
                )["items"]
                ready = sum(
                    any(
                        c["type"] == "Ready" and c["status"] == "True"
                        for c in (g.get("status") or {}).get("conditions", [])
                    )
                    for g in graphs
                )
                if ready == k:
                    ready_s = time.monotonic() - t0
            await asyncio.sleep(0.05)
        return Result(
            k=k,
            created_s=round(created_s, 2),
            children_s=children_s,
            pods_ready_s=pods_ready_s,
            ready_s=ready_s,
            operator_cpu_s=round(cpu_seconds(proc.pid) - cpu0, 2),
            operator_peak_rss_mib=round(peak_rss_mib(proc.pid), 1),
        )
    finally:
        await api.close()


def fmt(value: float | None) -> str:
    return "timeout" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--k", type=int, nargs="+", default=[1, 10, 50], help="graph counts to measure")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per K")
    parser.add_argument("--json-out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp,
        LocalCluster(Path(tmp) / "cluster") as cluster,
    ):
        for crd in sorted((REPO / "crds").glob("*.yaml")):
            cluster.kubectl("apply", "--server-side", "-f", str(crd))
        cluster.kubectl("wait", "--for=condition=Established", "crd/dynamographdeployments.nvidia.com")
        add_bench_node(cluster)
        results = [run_k(cluster, k, args.timeout, Path(tmp)) for k in args.k]
    print("\nOperator scale (each graph = frontend + 1-GPU worker: 2 Deployments, 1 Service, 2 pods)")
    columns = (
        "K",
        "DGDs created (s)",
        "children (s)",
        "pods ready (s)",
        "DGDs Ready (s)",
        "op CPU (s)",
        "peak RSS (MiB)",
        "CPU/graph (ms)",
    )
    print("".join(f"{c:>18}" for c in columns))
    for r in results:
        row = (
            r.k,
            *(fmt(v) for v in (r.created_s, r.children_s, r.pods_ready_s, r.ready_s)),
            f"{r.operator_cpu_s:.2f}",
            f"{r.operator_peak_rss_mib:.1f}",
            f"{1000 * r.operator_cpu_s / r.k:.1f}",
        )
        print("".join(f"{c:>18}" for c in row))
    first = results[0]
    for r in results[1:]:
        if first.children_s and r.children_s:
            ratio = r.children_s / first.children_s
            print(f"children time K={r.k} / K={first.k}: {ratio:.1f}x for {r.k / first.k:.0f}x graphs")
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
