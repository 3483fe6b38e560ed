"""A kubelet for tests: one node of the local control plane whose pods run as local processes.

kwok marks every pod Ready the moment it is scheduled, and runs nothing. Where a test needs the pods'
readiness to follow real processes (a rolling update that must keep serving, a graph scaling from zero),
it starts a ``LocalKubelet``: a Node of its own (tainted, so only pods that tolerate it land there, and
unmanaged by kwok), kept alive with a Lease as a kubelet keeps it, whose pods it runs:

- each pod's main container runs as a process, localized exactly as dynamo-run localizes a rendered pod
  (``dynamo_worker.local.kubelet.localize``: every declared port a free local port, the downward API,
  ``$(VAR)``), with ``python3`` as this interpreter;
- its status is written as a kubelet writes it: ``Running`` with the pod IP 127.0.0.1, ``ContainersReady``
  from the container's readinessProbe (an HTTP GET on its local port: every 0.2 s until it first
  passes, then every ``periodSeconds``, unready after ``failureThreshold`` failures in a row, as the
  kubelet probes), ``Ready`` when the containers are ready and every readiness gate's condition is True
  (the kubelet's rule);
- a pod being deleted gets SIGTERM, its grace period to exit (SIGKILL after), and is then removed from
  the API server (grace 0), as the kubelet finishes a deletion;
- with ``pod_network=True``, each pod gets an address of its own on the loopback (``127.x.y.z``, the
  ``podIP`` in its status) where every declared containerPort answers, forwarded to the process's local
  port: what the operator reaches at ``http://<podIP>:9090`` (a worker's system port) is that pod, as
  in a cluster. Off by default: the pods' status then says ``127.0.0.1``.

What it does not do: restart containers, run init containers or other containers than ``main``, read
Secrets, ConfigMaps or volumes. Mocks only what cannot run here (a node's container runtime).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from dynamo_worker.local.kubelet import Pod, localize
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from tests.support.ports import free_ports
from tests.support.procs import popen

log = logging.getLogger(__name__)

TAINT_KEY = "dynamo.test/local-kubelet"
STRATEGIC = "application/strategic-merge-patch+json"
LOOP_S = 0.2
LEASE_S = 5.0
API_TIMEOUT_S = 30.0
T = TypeVar("T")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Running:
    pod: dict
    proc: subprocess.Popen
    ports: dict[int, int]  # containerPort -> local port
    probe_url: str | None
    failure_threshold: int  # consecutive probe failures that make a ready container unready
    period_s: float  # how often a ready container is probed (periodSeconds)
    log_path: Path
    forwards: list[asyncio.Server] = field(default_factory=list)  # pod_network: podIP:port -> local
    containers_ready: bool = False
    failures: int = 0
    probed_at: float = 0.0
    terminating_since: float | None = None
    reported: tuple[bool, bool] | None = None  # (containers ready, ready) last written


@dataclass
class LocalKubelet:
    """Run the pods bound to node ``node`` (see the module docstring). ``start`` / ``stop``."""

    kubeconfig: Path
    namespace: str
    log_dir: Path
    node: str = ""
    pod_network: bool = False
    _pods: dict[str, _Running] = field(default_factory=dict)  # by uid
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    def __post_init__(self) -> None:
        self.node = self.node or f"local-{self.namespace}"[:63]
        # The operator's client (kubernetes_asyncio), on an event loop of the kubelet's own in a thread
        # of its own: the kubelet's calls block their caller, as a kubelet's would, from any thread
        # (a test's event loop included).
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._loop.run_forever, name=f"kubelet-api-{self.node}", daemon=True
        )
        self._loop_thread.start()
        self._api = self._call(
            config.new_client_from_config(config_file=str(self.kubeconfig), persist_config=False)
        )
        self._core = client.CoreV1Api(self._api)
        self._leases = client.CoordinationV1Api(self._api)
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def _call(self, call: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(call, self._loop).result(API_TIMEOUT_S)

    # --- what a manifest adds to land on this node ---------------------------------------------------

    def placement(self) -> dict[str, Any]:
        """The ``extraPodSpec`` fields that put a service's pods on this node."""
        return {
            "nodeSelector": {"kubernetes.io/hostname": self.node},
            "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        }

    # --- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> LocalKubelet:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node, "labels": {"kubernetes.io/hostname": self.node}},
            "spec": {"taints": [{"key": TAINT_KEY, "value": self.namespace, "effect": "NoSchedule"}]},
        }
        self._call(self._core.create_node(node))
        self._heartbeat(first=True)
        self._thread = threading.Thread(target=self._run, name=f"kubelet-{self.node}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        for running in self._pods.values():
            self._terminate(running, grace_s=5.0)
        with contextlib.suppress(ApiException):
            self._call(self._core.delete_node(self.node))
        self._call(self._api.close())
        self._call(_cancel_others())  # relays of pod_network still open
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(5)
        self._loop.close()

    def check(self) -> None:
        """Raise what stopped the kubelet's loop, if anything did."""
        if self._error is not None:
            raise AssertionError(f"the test kubelet failed: {self._error!r}") from self._error

    # --- what tests read -------------------------------------------------------------------------------

    def local_port(self, pod_prefix: str, container_port: int) -> int | None:
        """The local port of ``container_port`` of the first running pod whose name starts so."""
        for running in self._pods.values():
            name = running.pod["metadata"]["name"]
            if name.startswith(pod_prefix) and running.terminating_since is None:
                return running.ports.get(container_port)
        return None

    def logs(self) -> dict[str, str]:
        return {
            r.pod["metadata"]["name"]: r.log_path.read_text(errors="replace")
            for r in self._pods.values()
            if r.log_path.exists()
        } | {p.stem: p.read_text(errors="replace") for p in self.log_dir.glob("*.log")}

    # --- the loop ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        last_beat = time.monotonic()
        try:
            while not self._stop.is_set():
                if time.monotonic() - last_beat > LEASE_S:
                    self._heartbeat()
                    last_beat = time.monotonic()
                self._sync()
                self._stop.wait(LOOP_S)
        except BaseException as e:  # surfaced by check(); the test fails with it
            self._error = e
            log.exception("Test kubelet stopped")

    def _heartbeat(self, first: bool = False) -> None:
        now = _now()
        status = {
            "status": {
                "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
                "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "test kubelet is posting ready status",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            }
        }
        self._call(self._core.patch_node_status(self.node, status, _content_type=STRATEGIC))
        micro = datetime.datetime.now(datetime.UTC)
        lease = {
            "metadata": {"name": self.node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": self.node, "leaseDurationSeconds": 40, "renewTime": micro},
        }
        if first:
            with contextlib.suppress(ApiException):
                self._call(self._leases.create_namespaced_lease("kube-node-lease", lease))
        self._call(self._leases.patch_namespaced_lease(self.node, "kube-node-lease", {"spec": lease["spec"]}))

    def _sync(self) -> None:
        pods = self._call(
            self._core.list_namespaced_pod(self.namespace, field_selector=f"spec.nodeName={self.node}")
        ).items
        seen = set()
        for obj in pods:
            pod = self._api.sanitize_for_serialization(obj)
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            running = self._pods.get(uid)
            if running is None:
                if pod["metadata"].get("deletionTimestamp"):
                    self._delete(pod)
                    continue
                running = self._pods[uid] = self._start(pod)
            running.pod = pod
            if pod["metadata"].get("deletionTimestamp"):
                self._finish_deletion(running)
            else:
                self._probe_and_report(running)
        for uid in [u for u in self._pods if u not in seen]:  # removed behind our back
            self._terminate(self._pods.pop(uid), grace_s=5.0)

    def _start(self, pod: dict) -> _Running:
        meta = pod["metadata"]
        main = next(c for c in pod["spec"]["containers"] if c["name"] == "main")
        declared = [int(p["containerPort"]) for p in main.get("ports", [])]
        ports = dict(zip(declared, free_ports(len(declared)), strict=True))
        local = localize(
            Pod(
                meta["name"],
                meta["namespace"],
                meta.get("labels", {}),
                meta.get("annotations", {}),
                pod["spec"],
            ),
            ports,
            {},
        )
        argv = list(local.argv)
        if argv and argv[0] in ("python3", "python"):
            argv[0] = sys.executable
        log_path = self.log_dir / f"{meta['name']}.log"
        with open(log_path, "ab") as out:
            proc = popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **local.env})
        readiness = main.get("readinessProbe") or {}
        probe = readiness.get("httpGet")
        url = None
        if probe:
            named = {p.get("name"): int(p["containerPort"]) for p in main.get("ports", [])}
            port = probe["port"]
            container_port = named.get(port) if isinstance(port, str) else int(port)
            if container_port in ports:
                url = f"http://127.0.0.1:{ports[container_port]}{probe.get('path', '/')}"
        pod_ip, forwards = self._pod_address(ports) if self.pod_network else ("127.0.0.1", [])
        now = _now()
        self._patch_status(
            meta["name"],
            {
                "phase": "Running",
                "podIP": pod_ip,
                "podIPs": [{"ip": pod_ip}],
                "hostIP": "127.0.0.1",
                "startTime": now,
                "conditions": [{"type": "Initialized", "status": "True", "lastTransitionTime": now}],
            },
        )
        log.info("Started pod=%s pid=%s", meta["name"], proc.pid)
        threshold = int(readiness.get("failureThreshold", 3))
        period = float(readiness.get("periodSeconds", 10))
        return _Running(pod, proc, ports, url, threshold, period, log_path, forwards)

    def _pod_address(self, ports: Mapping[int, int]) -> tuple[str, list[asyncio.Server]]:
        """A free loopback address for a pod, each of its declared ports forwarded from there."""
        for _ in range(20):
            ip = f"127.{random.randint(10, 250)}.{random.randint(1, 254)}.{random.randint(1, 254)}"
            forwards: list[asyncio.Server] = []
            try:
                for container_port, local in ports.items():
                    forwards.append(self._call(_forward(ip, container_port, local)))
            except OSError:  # taken by another test's pod: another address
                for server in forwards:
                    self._call(_close(server))
                continue
            return ip, forwards
        raise RuntimeError("no free loopback address for a pod after 20 tries")

    def _probe_and_report(self, running: _Running) -> None:
        alive = running.proc.poll() is None
        now_s = time.monotonic()
        if not alive:
            running.containers_ready = False
        elif not running.containers_ready or now_s - running.probed_at >= running.period_s:
            # not ready yet: probed every loop (a start is seen at once); ready: every periodSeconds,
            # and unready after failureThreshold failures in a row, as the kubelet does
            running.probed_at = now_s
            if running.probe_url is None or _http_ok(running.probe_url):
                running.containers_ready, running.failures = True, 0
            else:
                running.failures += 1
                if running.failures >= running.failure_threshold:
                    running.containers_ready = False
        ready = running.containers_ready
        gates = [g["conditionType"] for g in running.pod["spec"].get("readinessGates") or []]
        conditions = {
            c["type"]: c.get("status") for c in running.pod.get("status", {}).get("conditions") or []
        }
        pod_ready = ready and all(conditions.get(g) == "True" for g in gates)
        if running.reported == (ready, pod_ready) and conditions.get("Ready") == str(pod_ready):
            return
        now = _now()
        state: dict[str, Any] = {"running": {"startedAt": now}}
        if not alive:
            state = {"terminated": {"exitCode": running.proc.returncode or 0, "finishedAt": now}}
        main = next(c for c in running.pod["spec"]["containers"] if c["name"] == "main")
        self._patch_status(
            running.pod["metadata"]["name"],
            {
                "conditions": [
                    {"type": "ContainersReady", "status": str(ready), "lastTransitionTime": now},
                    {"type": "Ready", "status": str(pod_ready), "lastTransitionTime": now},
                ],
                "containerStatuses": [
                    {
                        "name": "main",
                        "image": main.get("image", ""),
                        "imageID": "",
                        "ready": ready,
                        "started": alive,
                        "restartCount": 0,
                        "state": state,
                    }
                ],
            },
        )
        running.reported = (ready, pod_ready)

    def _finish_deletion(self, running: _Running) -> None:
        if running.terminating_since is None:
            running.terminating_since = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(running.proc.pid, signal.SIGTERM)
        grace = running.pod["spec"].get("terminationGracePeriodSeconds") or 30
        if running.proc.poll() is None and time.monotonic() - running.terminating_since < grace:
            return
        self._terminate(running, grace_s=0.0)
        self._delete(running.pod)
        self._pods.pop(running.pod["metadata"]["uid"], None)

    def _delete(self, pod: dict) -> None:
        meta = pod["metadata"]
        body = client.V1DeleteOptions(grace_period_seconds=0, preconditions={"uid": meta["uid"]})
        with contextlib.suppress(ApiException):
            self._call(self._core.delete_namespaced_pod(meta["name"], meta["namespace"], body=body))

    def _terminate(self, running: _Running, grace_s: float) -> None:
        for server in running.forwards:
            self._call(_close(server))
        running.forwards = []
        proc = running.proc
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def _patch_status(self, name: str, status: Mapping[str, Any]) -> None:
        with contextlib.suppress(ApiException):  # a pod deleted meanwhile
            self._call(
                self._core.patch_namespaced_pod_status(
                    name, self.namespace, {"status": status}, _content_type=STRATEGIC
                )
            )


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass


async def _forward(ip: str, port: int, local: int) -> asyncio.Server:
    """A listener on ``ip:port`` whose every connection is relayed to ``127.0.0.1:local``."""

    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", local)
        except OSError:  # the process is not listening (yet, or any more): refused, as a pod would
            client_w.close()
            return
        try:
            await asyncio.gather(_pipe(client_r, upstream_w), _pipe(upstream_r, client_w))
        finally:
            upstream_w.close()
            client_w.close()

    return await asyncio.start_server(relay, ip, port)


async def _cancel_others() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _close(server: asyncio.Server) -> None:
    server.close()  # open relays end with their process


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False
