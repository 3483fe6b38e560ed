"""Shared fixtures: a real nats-server, and the real local Kubernetes control plane."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from dynamo_worker.runtime.nats_server import NatsServer
from hypothesis import settings as hypothesis_settings

from tests.support.cluster import LocalCluster
from tests.support.procs import die_with_parent

pytest_plugins = ["tests.support.faults_table"]  # the fault table, whole under pytest-xdist too

# Property tests assert what is computed, never how fast: no per-example deadline (hypothesis's 200 ms
# default failed a parse on a machine busy with a parallel suite and a background build).
hypothesis_settings.register_profile("suite", deadline=None)
hypothesis_settings.load_profile("suite")

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient

CHART_TESTS = Path(__file__).parent / "integration" / "chart"  # helm, kubeconform, hack/lint-chart.sh
REAL_NODE_TESTS = Path(__file__).parent / "real"  # inside the real-node cluster (tests/support/realnode.py)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``control_plane`` every test that needs the control-plane binaries (hack/build-binaries.sh):
    those that use the local cluster, and the chart's (helm, kubeconform). CI runs the others while the
    binaries build, then these (``make test``: hack/test.sh; or ``make test-no-cluster`` and
    ``make test-cluster``). Tests under ``tests/real`` are ``real_node`` too: they run inside the
    real-node cluster, last (``make test-real``)."""
    for item in items:
        if "kube_cluster" in getattr(item, "fixturenames", ()) or CHART_TESTS in item.path.parents:
            item.add_marker(pytest.mark.control_plane)
        if REAL_NODE_TESTS in item.path.parents:
            item.add_marker(pytest.mark.control_plane)
            item.add_marker(pytest.mark.real_node)


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    """A real nats-server with JetStream on a free 127.0.0.1 port, for the whole session."""
    with NatsServer(command_prefix=die_with_parent()) as server:
        yield server


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """etcd + kube-apiserver + controller-manager + scheduler + kwok (2 fake nodes with 8 GPUs each),
    on 127.0.0.1, for the whole session. Binaries come from the version-keyed cache."""
    with LocalCluster(tmp_path_factory.mktemp("cluster"), die_with_parent=True) as cluster:
        yield cluster


@pytest.fixture
async def k8s_api(kube_cluster: LocalCluster) -> AsyncIterator[ApiClient]:
    """A kubernetes_asyncio ApiClient (the operator's client) bound to the local control plane."""
    from kubernetes_asyncio import config

    api = await config.new_client_from_config(config_file=str(kube_cluster.kubeconfig), persist_config=False)
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture
def k8s_namespace(kube_cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (without waiting for finalization)."""
    base = request.node.name.lower().replace("_", "-")
    name = f"{''.join(c for c in base if c.isalnum() or c == '-')[:40].strip('-')}-{uuid.uuid4().hex[:6]}"
    kube_cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        kube_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
