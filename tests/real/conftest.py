"""The real-node tier's fixtures: the cluster these tests run inside (``tests.support.realnode run``), the
operator installed by Helm from the images built here, and the ways a user reaches a graph: ``kubectl``,
and ``kubectl port-forward`` to the frontend Service with the official ``openai`` client.

Every test here runs inside the cluster's network namespace, on one real node (containerd, runc, the
kubelet, kube-proxy, CoreDNS): nothing is simulated.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import realnode

REPO = Path(__file__).resolve().parents[2]
READY_S = 240  # a graph's pods: image already on the node, Python starting on a busy 2-core machine


class KubectlError(AssertionError):
    pass


@dataclass
class Real:
    """kubectl inside the real-node cluster."""

    dir: Path

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120) -> str:
        r = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise KubectlError(f"kubectl {' '.join(args)} failed: {r.stderr.strip()}")
        return r.stdout if check else r.stdout + r.stderr

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def apply(self, namespace: str, docs: list[dict[str, Any]], check: bool = True) -> str:
        return self.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs), check=check)

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        args = ["get", "pods", "-n", namespace, *(["-l", selector] if selector else [])]
        return list(self.json(*args)["items"])

    def explain(self, namespace: str) -> str:
        """What a failing test prints: the pods, the events and the tail of each container's log."""
        out = [
            self.kubectl("get", "pods,dgd", "-n", namespace, "-o", "wide", check=False),
            self.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False)[-4000:],
        ]
        for pod in self.pods(namespace):
            name = pod["metadata"]["name"]
            out.append(
                f"--- {name}\n"
                + self.kubectl("logs", "-n", namespace, name, "--all-containers", "--tail=25", check=False)
            )
        return "\n".join(out)


@pytest.fixture(scope="session")
def real() -> Real:
    where = os.environ.get("DYNAMO_REALNODE_DIR")
    if not where:
        pytest.fail(
            "tests/real runs inside the real-node cluster: `make test-real`, or "
            "python -m tests.support.realnode run -- python -m pytest tests/real"
        )
    return Real(Path(where))


@pytest.fixture(scope="session")
def operator(real: Real) -> dict[str, float]:
    """``helm install`` of charts/dynamo-operator with the images built here (the first test's subject);
    the seconds it took to be Ready."""
    t0 = time.monotonic()
    args = realnode.helm_upgrade()
    r = subprocess.run(["helm", *args], capture_output=True, text=True, timeout=400)
    if r.returncode != 0:
        pytest.fail(f"helm install failed: {r.stderr.strip()}\n{real.explain(realnode.RELEASE)}")
    return {"ready_s": time.monotonic() - t0}


@pytest.fixture
def namespace(real: Real, request: pytest.FixtureRequest) -> Iterator[str]:
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    real.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        report = getattr(request.node, "rep_call", None)  # set by tests/support/faults_table.py
        if report is not None and report.failed:
            print(real.explain(name))
        real.kubectl("delete", "namespace", name, "--wait=false", check=False)


@contextlib.contextmanager
def port_forward(namespace: str, target: str, port: int, timeout: float = 30) -> Iterator[int]:
    """``kubectl port-forward`` to ``target`` (e.g. ``svc/NAME``); yields the local port."""
    proc = subprocess.Popen(
        ["kubectl", "port-forward", "-n", namespace, "--address", "127.0.0.1", target, f":{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + timeout
        assert proc.stdout is not None
        seen = ""
        while (left := deadline - time.monotonic()) > 0 and proc.poll() is None:
            if not select.select([proc.stdout], [], [], left)[0]:
                break
            line = proc.stdout.readline()
            seen += line
            if m := re.search(r"Forwarding from 127\.0\.0\.1:(\d+)", line):
                yield int(m.group(1))
                return
        raise KubectlError(
            f"kubectl port-forward {target} did not start within {timeout:.0f}s: {seen.strip()}"
        )
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        proc.stdout.close()
