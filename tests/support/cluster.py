"""A real, local Kubernetes control plane for the integration tier and for `make cluster-up`.

Started from binaries built by ``hack/build-binaries.sh`` (cached by version):

    etcd -> kube-apiserver -> kube-controller-manager + kube-scheduler -> kwok (fake nodes)

Everything listens on 127.0.0.1 on free ports. Certificates (a CA, the apiserver's serving certificate,
an admin client certificate in ``system:masters``, the service-account key pair) and a kubeconfig are
generated locally with ``openssl``. kwok manages nodes annotated ``kwok.x-k8s.io/node=fake``: it keeps
them Ready and makes every pod scheduled onto them Running and Ready, so Deployments and StatefulSets
reach their ready counts. Two such nodes are created, each with ``nvidia.com/gpu: 8`` and, like a real
GPU node, ``ephemeral-storage`` and ``hugepages-2Mi`` (``NODE_RESOURCES``).

Usage from the shell (what ``make cluster-up`` / ``make cluster-down`` run)::

    python -m tests.support.cluster up [--dir .cluster]     # prints: export KUBECONFIG=...
    python -m tests.support.cluster down [--dir .cluster]

Every process is recorded by PID in ``<dir>/pids`` and stopped by PID. A component that fails to
start raises ``ClusterError`` with the tail of its log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import textwrap
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.ports import free_ports
from tests.support.procs import die_with_parent

REPO = Path(__file__).resolve().parents[2]
GPU_NODES = ("kwok-gpu-0", "kwok-gpu-1")
GPUS_PER_NODE = 8
# What each fake node advertises, like a real 8-GPU node (DGX-class sizes).
NODE_RESOURCES = {
    "cpu": "64",
    "memory": "512Gi",
    "pods": "250",
    "ephemeral-storage": "2Ti",
    "hugepages-2Mi": "16Gi",
    "nvidia.com/gpu": str(GPUS_PER_NODE),
    "rdma/ib": "8",
}
PORT_ATTEMPTS = 3


class ClusterError(RuntimeError):
    pass


def free_port() -> int:
    return free_ports(1)[0]


def bin_dir() -> Path:
    """Build (once) or find the cached binaries; returns their folder."""
    out = subprocess.run(
        ["bash", str(REPO / "hack" / "build-binaries.sh")], check=False, stdout=subprocess.PIPE, text=True
    )
    if out.returncode != 0:
        raise ClusterError("hack/build-binaries.sh failed; see its output above")
    return Path(out.stdout.strip().splitlines()[-1])


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args)} failed: {r.stderr.strip()}")


def make_pki(d: Path, extra_sans: tuple[str, ...] = ()) -> None:
    """CA, apiserver serving cert for 127.0.0.1/localhost (and ``extra_sans``, e.g. ``IP:198.18.0.1``),
    admin client cert, service-account keys."""
    d.mkdir(parents=True, exist_ok=True)
    if (d / "admin.crt").exists():
        return
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "3650", "-subj", "/CN=dynamo-test-ca", cwd=d)  # fmt: skip
    sans = ",".join(
        ("IP:127.0.0.1", "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default", *extra_sans)
    )
    (d / "server.ext").write_text(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subj, ext in (
        ("server", "/CN=kube-apiserver", "server.ext"),
        ("admin", "/O=system:masters/CN=admin", "client.ext"),
    ):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subj, cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "3650", "-extfile", ext, cwd=d)  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def kubeconfig_text(server: str, pki: Path) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Config
        clusters:
        - name: local
          cluster:
            server: {server}
            certificate-authority: {pki / "ca.crt"}
        users:
        - name: admin
          user:
            client-certificate: {pki / "admin.crt"}
            client-key: {pki / "admin.key"}
        contexts:
        - name: local
          context: {{cluster: local, user: admin}}
        current-context: local
        """)


@dataclass
class LocalCluster:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok, on 127.0.0.1."""

    dir: Path
    bins: Path | None = None
    startup_timeout: float = 90.0
    # True when this process owns the cluster (test sessions): every component then dies with it,
    # even on SIGKILL (tests.support.procs). False for `make cluster-up`, which outlives its command.
    die_with_parent: bool = False
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def bin_dir(self) -> Path:
        assert self.bins is not None
        return self.bins

    def env(self) -> dict[str, str]:
        """Environment for child tools: KUBECONFIG and the binaries first on PATH."""
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin_dir}:{os.environ['PATH']}",
        }

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        if self.bins is None:
            self.bins = bin_dir()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        pki = self.dir / "pki"
        make_pki(pki)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            # Free ports are picked up front and bound later; a client's ephemeral port can take one
            # in between (the apiserver's own connections draw from the same range). Start again on
            # fresh ports, with an empty etcd, when that happens.
            names = ("etcd", "etcd-peer", "etcd-metrics", "apiserver", "kcm", "sched", "kwok")
            self.ports = dict(zip(names, free_ports(len(names)), strict=True))
            try:
                self._start_all(pki)
                return self
            except ClusterError as e:
                self.stop()
                if "address already in use" not in str(e) or attempt == PORT_ATTEMPTS:
                    raise
                shutil.rmtree(self.dir / "etcd", ignore_errors=True)
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _start_all(self, pki: Path) -> None:
        p = self.ports
        etcd_url = f"http://127.0.0.1:{p['etcd']}"
        peer_url = f"http://127.0.0.1:{p['etcd-peer']}"
        self._spawn("etcd", [
            "etcd", "--name", "default", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"default={peer_url}", "--unsafe-no-fsync",
            "--listen-metrics-urls", f"http://127.0.0.1:{p['etcd-metrics']}",
        ])  # fmt: skip
        self._wait_http("etcd", f"{etcd_url}/health")
        self._spawn("kube-apiserver", [
            "kube-apiserver", "--etcd-servers", etcd_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(p["apiserver"]),
            "--tls-cert-file", str(pki / "server.crt"), "--tls-private-key-file", str(pki / "server.key"),
            "--client-ca-file", str(pki / "ca.crt"),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--service-cluster-ip-range", "10.96.0.0/16", "--authorization-mode", "RBAC",
            "--allow-privileged=true", "--endpoint-reconciler-type", "none",
            "--cert-dir", str(self.dir / "apiserver-certs"),
        ])  # fmt: skip
        self.kubeconfig.write_text(kubeconfig_text(self.server, pki))
        self._wait_http("kube-apiserver", f"{self.server}/readyz", pki)
        common = ["--kubeconfig", str(self.kubeconfig), "--bind-address", "127.0.0.1", "--leader-elect=false"]
        self._spawn("kube-controller-manager", [
            "kube-controller-manager", *common, "--secure-port", str(p["kcm"]),
            "--service-account-private-key-file", str(pki / "sa.key"), "--root-ca-file", str(pki / "ca.crt"),
            "--controllers", "*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller",
            "--concurrent-deployment-syncs", "10", "--concurrent-replicaset-syncs", "10",
            "--concurrent-statefulset-syncs", "10", "--concurrent-gc-syncs", "20",
        ])  # fmt: skip
        self._spawn("kube-scheduler", ["kube-scheduler", *common, "--secure-port", str(p["sched"])])
        self._spawn("kwok", [
            "kwok", "--kubeconfig", str(self.kubeconfig), "--config", str(self.bin_dir / "kwok-stages.yaml"),
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector", "kwok.x-k8s.io/node=fake",
            "--cidr", "10.244.0.1/16", "--node-ip", "10.0.0.1",
            "--server-address", f"127.0.0.1:{p['kwok']}",
        ])  # fmt: skip
        self._wait_http("kube-controller-manager", f"https://127.0.0.1:{p['kcm']}/healthz", insecure=True)
        self._wait_http("kube-scheduler", f"https://127.0.0.1:{p['sched']}/healthz", insecure=True)
        # kwok exits when its server's port is taken ("address already in use"), and no node of ours
        # then turns Ready: its health says so, with its log, where the node wait would only time out.
        self._wait_http("kwok", f"http://127.0.0.1:{p['kwok']}/healthz")
        self._create_nodes()

    def _create_nodes(self) -> None:
        # kwok's node controller keeps status.capacity/allocatable as created: advertise what a real GPU
        # node does (ephemeral-storage and hugepages too), so manifests that request them schedule.
        for name in GPU_NODES:
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {
                        "type": "kwok", "kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true",
                    },
                },
                "status": {"allocatable": NODE_RESOURCES, "capacity": NODE_RESOURCES},
            }  # fmt: skip
            self.kubectl("apply", "-f", "-", input=json.dumps(node))
        try:
            self.kubectl("wait", "--for=condition=Ready", "node", *GPU_NODES, "--timeout=60s")
        except ClusterError as e:
            kwok = self.procs["kwok"]
            state = "running" if kwok.poll() is None else f"exited with code {kwok.returncode}"
            tail = self.log_tail("kwok")
            raise ClusterError(f"{e}\nkwok, which makes them Ready, {state}:\n{tail}") from None

    def start_gang_scheduler(self, scheduler_name: str) -> subprocess.Popen:
        """scheduler-plugins' kube-scheduler with the coscheduling plugin, as a second scheduler named
        ``scheduler_name``, after its PodGroup CRD (``podgroup-crd.yaml``) is installed and established.
        Stop it with :meth:`stop_gang_scheduler`."""
        self.kubectl("apply", "--server-side", "-f", str(self.bin_dir / "podgroup-crd.yaml"))
        self.kubectl(
            "wait", "--for=condition=Established", "crd/podgroups.scheduling.x-k8s.io", "--timeout=60s"
        )
        port = free_port()
        config = self.dir / "gang-scheduler.yaml"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "leaderElection": {"leaderElect": False},
                    "clientConnection": {"kubeconfig": str(self.kubeconfig)},
                    "profiles": [
                        {
                            "schedulerName": scheduler_name,
                            "plugins": {
                                "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                                "queueSort": {
                                    "enabled": [{"name": "Coscheduling"}],
                                    "disabled": [{"name": "*"}],
                                },
                            },
                            "pluginConfig": [
                                {"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": 10}}
                            ],
                        }
                    ],
                }
            )
        )
        self._spawn(
            "gang-scheduler",
            [
                "kube-scheduler-plugins",
                "--config",
                str(config),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(port),
            ],
        )
        self._wait_http("gang-scheduler", f"https://127.0.0.1:{port}/healthz", insecure=True)
        return self.procs["gang-scheduler"]

    def stop_gang_scheduler(self) -> None:
        """Stop it and remove its CRD, so that operators started later find no gang scheduler."""
        proc = self.procs.pop("gang-scheduler", None)
        if proc is not None:
            stop_pids([("gang-scheduler", proc.pid)])
            proc.wait(timeout=5) if proc.poll() is None else None
        self.kubectl("delete", "crd", "podgroups.scheduling.x-k8s.io", "--ignore-not-found", "--timeout=60s")

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        r = subprocess.run(
            [str(self.bin_dir / "kubectl"), *args], input=input, capture_output=True, text=True,
            env=self.env(), timeout=120,
        )  # fmt: skip
        if check and r.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: {r.stderr.strip()}")
        return r.stdout

    def _spawn(self, name: str, cmd: list[str]) -> None:
        cmd = [*(die_with_parent() if self.die_with_parent else ()), str(self.bin_dir / cmd[0]), *cmd[1:]]
        with open(self.dir / "logs" / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        with open(self.dir / "pids", "a") as f:
            f.write(f"{name} {self.procs[name].pid}\n")

    def log_tail(self, name: str, lines: int = 30) -> str:
        try:
            text = (self.dir / "logs" / f"{name}.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _wait_http(self, name: str, url: str, pki: Path | None = None, insecure: bool = False) -> None:
        ctx = None
        if url.startswith("https"):
            ctx = (
                ssl.create_default_context(cafile=str(pki / "ca.crt"))
                if pki
                else ssl.create_default_context()
            )
            if pki:
                ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
            if insecure:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
        deadline = time.monotonic() + self.startup_timeout
        last = ""
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited with code {proc.returncode}:\n{self.log_tail(name)}")
            try:
                with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
                    if r.status == 200:
                        return
            except Exception as e:  # still starting: connection refused, 500 from /readyz, ...
                last = str(e)
            time.sleep(0.2)
        raise ClusterError(
            f"{name} not healthy at {url} after {self.startup_timeout:.0f}s ({last}):\n{self.log_tail(name)}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every component by PID, newest first."""
        stop_pids([(n, p.pid) for n, p in self.procs.items()], timeout)
        for p in self.procs.values():
            p.wait(timeout=1) if p.poll() is None else None
        self.procs.clear()
        (self.dir / "pids").unlink(missing_ok=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_pids(named_pids: list[tuple[str, int]], timeout: float = 10.0) -> None:
    for _, pid in reversed(named_pids):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for _, pid in named_pids:
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.support.cluster", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["up", "down"])
    ap.add_argument("--dir", type=Path, default=REPO / ".cluster", help="state folder (default: .cluster)")
    a = ap.parse_args(argv)
    pids_file = a.dir / "pids"
    if a.action == "down":
        if not pids_file.exists():
            print(f"No cluster recorded in {a.dir}")
            return 0
        pairs = [(n, int(p)) for n, p in (line.split() for line in pids_file.read_text().splitlines())]
        stop_pids(pairs)
        pids_file.unlink()
        print(f"Stopped {', '.join(n for n, _ in pairs)}")
        return 0
    if pids_file.exists():
        print(f"A cluster is already recorded in {a.dir}: run `make cluster-down` first", file=sys.stderr)
        return 1
    for stale in ("etcd", "kubeconfig"):
        target = a.dir / stale
        if target.is_dir():
            subprocess.run(["rm", "-rf", str(target)], check=True)
    t0 = time.monotonic()
    cluster = LocalCluster(a.dir).start()
    print(f"Local control plane up in {time.monotonic() - t0:.1f}s: {cluster.server}", file=sys.stderr)
    print(f"nodes: {', '.join(GPU_NODES)} ({GPUS_PER_NODE} nvidia.com/gpu each); logs in {a.dir / 'logs'}",
          file=sys.stderr)  # fmt: skip
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    print(f"export PATH={cluster.bin_dir}:$PATH")
    return 0


if __name__ == "__main__":
    sys.exit(main())
