"""Fixtures for operator integration tests on the real local control plane: the CRDs installed once,
the operator run as a real subprocess (``python -m dynamo_operator``) scoped to the test's namespace and
serving the conversion webhook on 127.0.0.1 (it points the shared CRD at itself when it starts),
and a small kubectl helper that polls the state of the world with deadlines."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import wait
from tests.support.cluster import ClusterError, LocalCluster
from tests.support.manifests import graph_of
from tests.support.ports import free_ports
from tests.support.procs import popen

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
LWS_CRD = Path(__file__).with_name("lws-crd.yaml")
DGD_CRD = "dynamographdeployments.nvidia.com"
ADAPTER_CRD = "dynamographdeploymentscalingadapters.nvidia.com"
MODEL_CRD = "dynamomodels.nvidia.com"
LWS_CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"
WAIT_S = 60.0


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned), or fail naming ``what``
    (tests/support/wait.py, with this tier's default bound)."""
    return wait.wait_until(predicate, what, timeout_s=timeout, interval_s=0.2)


def condition_of(obj: dict | None, type_: str = "Ready") -> dict | None:
    """The condition ``type_`` of a DGD read once (checks on one object see one status)."""
    conds = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_), None)


def _last_value(argv: list[str], flag: str) -> str | None:
    """The value of the last ``flag VALUE`` or ``flag=VALUE`` in ``argv`` (None: not given)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def example(name: str) -> dict:
    """An example's graph as a dict (a fresh copy each call; DynamoModels beside it are left out)."""
    return copy.deepcopy(graph_of(EXAMPLES / name))


def too_wide_disagg(name: str) -> dict:
    """examples/disagg.yaml named ``name``, its decode engine two GPUs wide on a pod of one: a graph the
    validating webhook refuses."""
    graph = example("disagg.yaml")
    graph["metadata"]["name"] = name
    args = graph["spec"]["services"]["decode"]["extraPodSpec"]["mainContainer"]["args"]
    args[args.index("--tp") + 1] = "2"
    return graph


DGD_V1ALPHA1 = "dynamographdeployments.v1alpha1.nvidia.com"


def _at_version(arg: str, resource: str) -> str:
    if arg == "dgd":
        return resource
    if arg.startswith("dgd/"):
        return f"{resource}/{arg[4:]}"
    return arg


@dataclass
class Kubectl:
    """kubectl against the local control plane, in one namespace, returning parsed JSON.

    ``dgd`` means the graph at ``dgd_resource``: v1alpha1 by default (what the manifests under examples/
    are written in; every such request goes through the operator's conversion webhook, since the API
    server stores v1beta1). Plain ``kubectl get dgd`` would answer v1beta1, the preferred version."""

    cluster: LocalCluster
    namespace: str
    dgd_resource: str = DGD_V1ALPHA1

    def run(self, *args: str, input: str | None = None, check: bool = True) -> str:
        args = tuple(_at_version(a, self.dgd_resource) for a in args)
        return self.cluster.kubectl("-n", self.namespace, *args, input=input, check=check)

    def apply(self, manifest: dict) -> None:
        self.run("apply", "-f", "-", input=json.dumps(manifest))

    def get(self, kind: str, name: str) -> dict | None:
        out = self.run("get", kind, name, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None

    def list(self, kind: str, selector: str | None = None) -> list[dict]:
        args = ["get", kind, "-o", "json"] + (["-l", selector] if selector else [])
        return json.loads(self.run(*args))["items"]

    def patch(self, kind: str, name: str, patch: Any, type_: str = "merge") -> None:
        self.run("patch", kind, name, "--type", type_, "-p", json.dumps(patch))

    def delete(self, kind: str, name: str, *args: str) -> None:
        self.run("delete", kind, name, *args)

    def events(self, name: str, reason: str | None = None) -> list[dict]:
        items = self.list("events")
        return [
            e
            for e in items
            if e["involvedObject"].get("name") == name and (reason is None or e.get("reason") == reason)
        ]

    def condition(self, dgd: str, type_: str = "Ready") -> dict | None:
        return condition_of(self.get("dgd", dgd), type_)

    def service_account_kubeconfig(self, account: str, path: Path) -> Path:
        """A kubeconfig at ``path`` that authenticates as ServiceAccount ``account`` (a token of it), as
        a pod of that account would (a planner: its Role is then what is exercised)."""
        token = self.run("create", "token", account, "--duration", "1h").strip()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": self.cluster.server,
                        "certificate-authority": str(self.cluster.dir / "pki" / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": account}}],
            "current-context": "local",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def wait_ready(self, dgd: str, timeout: float = WAIT_S) -> dict:
        """``kubectl wait --for=condition=Ready``, then the DGD."""
        self.run("wait", "--for=condition=Ready", f"dgd/{dgd}", f"--timeout={int(timeout)}s")
        obj = self.get("dgd", dgd)
        assert obj is not None
        return obj


@pytest.fixture(scope="session")
def dgd_crd(kube_cluster: LocalCluster) -> None:
    """The CRDs from crds/ (DynamoGraphDeployment, its scaling adapter, DynamoModel), applied once per
    session and Established.

    When it is already there (the chart test installed it) it is replaced: an operator of an earlier
    test wrote a webhook URL into it, which a server-side apply of the file's Service could only add to."""
    for path in sorted((REPO / "crds").glob("*.yaml")):
        if kube_cluster.kubectl("get", "-f", str(path), "--ignore-not-found", "-o", "name").strip():
            kube_cluster.kubectl("replace", "-f", str(path))
        else:
            kube_cluster.kubectl("apply", "--server-side", "-f", str(path))
    for crd in (DGD_CRD, ADAPTER_CRD, MODEL_CRD):
        kube_cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")


@pytest.fixture
def kc(kube_cluster: LocalCluster, k8s_namespace: str, dgd_crd: None) -> Kubectl:
    return Kubectl(kube_cluster, k8s_namespace)


@pytest.fixture
def lws_crd(kube_cluster: LocalCluster) -> Iterator[None]:
    """A minimal LeaderWorkerSet CRD (no LWS controller runs here), removed after the test so that
    other tests see a cluster without it."""
    kube_cluster.kubectl("apply", "-f", str(LWS_CRD))
    kube_cluster.kubectl("wait", "--for=condition=Established", f"crd/{LWS_CRD_NAME}", "--timeout=60s")
    try:
        yield
    finally:
        kube_cluster.kubectl(
            "delete", "crd", LWS_CRD_NAME, "--ignore-not-found", "--timeout=60s", check=False
        )


@dataclass
class OperatorProcess:
    """``python -m dynamo_operator --namespace NS`` as a subprocess; start/stop/restart it."""

    kubeconfig: Path
    namespace: str
    log_path: Path
    extra_args: tuple[str, ...] = ()
    proc: subprocess.Popen | None = None
    port: int = 0
    webhook_port: int = 0
    # Given, start() also waits until this cluster's API server calls the new operator's webhooks.
    cluster: LocalCluster | None = field(default=None, repr=False)
    _log: Any = field(default=None, repr=False)

    def start(self, timeout: float = 30.0) -> OperatorProcess:
        assert self.proc is None, "already running"
        self.port, self.webhook_port = free_ports(2)
        self._log = self.log_path.open("ab")
        cmd = [
            sys.executable, "-m", "dynamo_operator",
            "--namespace", self.namespace,
            "--kubeconfig", str(self.kubeconfig),
            "--liveness-host", "127.0.0.1",
            "--liveness-port", str(self.port),
            "--not-ready-recheck-s", "5",
            # No validating webhook unless a test asks for one (--validating-webhook NAME): most tests
            # apply graphs the operator itself must judge, as it does those stored while it was down.
            "--validating-webhook", "",
            *self.extra_args,
            # the conversion webhook, where this apiserver (on 127.0.0.1) can call it
            "--webhook-host", "127.0.0.1",
            "--webhook-port", str(self.webhook_port),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("DYN_OPERATOR_")}
        self.proc = popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        proc = self.proc

        def live() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"operator exited with {proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as resp:
                    return resp.status == 200
            except OSError:
                return False

        wait.wait_until(
            live, "the operator to be live", timeout_s=timeout, interval_s=0.2, explain=self.log_tail
        )
        if self.cluster is not None:
            validating = bool(_last_value(cmd, "--validating-webhook"))
            self._wait_webhooks_served(self.cluster, validating)
        return self

    def _wait_webhooks_served(self, cluster: LocalCluster, validating: bool, timeout: float = 30.0) -> None:
        """Wait until the API server calls this operator's webhooks: a v1alpha1 graph converts, and with
        a validating webhook, a graph that cannot run is refused (server-side dry runs, which go through
        both). The operator points the CRD and its webhook configuration at itself before it is live, but
        the API server takes such changes up from its own watch a moment later: until then it calls the
        previous operator's address (a loaded CI machine showed a test's first apply a closed port) and
        admits what the new one would refuse."""
        graph = example("agg.yaml")
        graph["metadata"]["name"] = "webhook-probe"
        too_wide = too_wide_disagg("webhook-probe-too-wide")
        last = [""]

        def dry_run(manifest: dict) -> str:
            """The API server's refusal of ``manifest`` ("" when it would be stored)."""
            try:
                cluster.kubectl(
                    "-n", self.namespace, "create", "--dry-run=server", "-f", "-", input=json.dumps(manifest)
                )
            except ClusterError as exc:
                return str(exc)
            return ""

        def served() -> bool:
            last[0] = dry_run(graph)
            if last[0] or not validating:
                return not last[0]
            refusal = dry_run(too_wide)
            last[0] = refusal or "the too-wide graph was admitted: the validating webhook is not called yet"
            return 'admission webhook "validate.dynamographdeployments.nvidia.com" denied' in refusal

        wait.wait_until(
            served,
            "the API server to call the new operator's webhooks",
            timeout_s=timeout,
            interval_s=0.2,
            explain=lambda: f"{last[0]}\n{self.log_tail()}",
        )

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@pytest.fixture
def operator_factory(
    kube_cluster: LocalCluster, k8s_namespace: str, dgd_crd: None, tmp_path: Path
) -> Iterator[Callable[..., OperatorProcess]]:
    """Start operators for the test's namespace with extra flags; all are stopped after the test
    (and their log tail printed when the test failed)."""
    started: list[OperatorProcess] = []

    def start(*extra_args: str) -> OperatorProcess:
        log = tmp_path / "operator.log"
        op = OperatorProcess(kube_cluster.kubeconfig, k8s_namespace, log, extra_args, cluster=kube_cluster)
        started.append(op)
        return op.start()

    try:
        yield start
    finally:
        for op in started:
            op.stop()
        if started:
            sys.stderr.write(f"--- operator log tail ({started[0].log_path}) ---\n{started[0].log_tail()}\n")


@pytest.fixture
def operator(operator_factory: Callable[..., OperatorProcess]) -> OperatorProcess:
    """The operator for this namespace, with the group backend detected (auto)."""
    return operator_factory()
