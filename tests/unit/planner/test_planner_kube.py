"""The planner's Kubernetes client (the operator's client, ``dynamo_clients.kube``): credentials that
cannot be loaded are a ``KubeError`` that says what to pass, from a kubeconfig or, with none, from a pod
that has no service account; nothing is connected before."""

from __future__ import annotations

import dynamo_clients.kube  # noqa: F401  (imported at collection: urllib3 probes IPv6 with a socket)
import pytest
from dynamo_api.kube_errors import KubeError
from dynamo_worker.planner.kube import GraphClient


async def test_a_missing_kubeconfig_names_the_file(tmp_path):
    path = tmp_path / "no-such-kubeconfig"
    with pytest.raises(KubeError, match=f"Could not load Kubernetes credentials from {path}"):
        async with GraphClient("ns", "g", str(path)):
            pass


async def test_no_kubeconfig_outside_a_pod_says_how_to_run_it(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeError, match="from the pod's service account") as err:
        async with GraphClient("ns", "g"):
            pass
    assert err.value.status == 0 and "outside a pod, pass --kubeconfig" in str(err.value)
