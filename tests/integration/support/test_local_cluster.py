"""The local control plane the integration tier runs on (``tests.support.cluster``) starts when a port it
picked is taken before its component binds it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support import cluster
from tests.support.cluster import GPU_NODES, LocalCluster


@pytest.mark.control_plane
def test_a_cluster_whose_kwok_port_is_taken_starts_again_on_fresh_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ports are picked free up front and bound later, so another process can take one in between; kwok
    then exits ("address already in use") and no node turns Ready. The start must see that and start
    again on fresh ports, not wait out the node timeout and fail (a CI run's whole control-plane half
    failed so). The collision is a real listening socket on the port; only the choice of that port for
    kwok's first attempt is forced, by wrapping ``free_ports``."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    picks: list[list[int]] = []
    real_free_ports = cluster.free_ports

    def kwok_port_taken_first(count: int) -> list[int]:
        ports = real_free_ports(count)
        if not picks:
            ports[-1] = taken.getsockname()[1]  # kwok's port is the last one picked
        picks.append(ports)
        return ports

    monkeypatch.setattr(cluster, "free_ports", kwok_port_taken_first)
    try:
        with LocalCluster(tmp_path / "cluster", die_with_parent=True) as local:
            assert len(picks) == 2, picks
            assert local.ports["kwok"] != taken.getsockname()[1]
            conditions = 'jsonpath={.items[*].status.conditions[?(@.type=="Ready")].status}'
            ready = local.kubectl("get", "nodes", *GPU_NODES, "-o", conditions)
            assert ready.split() == ["True", "True"]
    finally:
        taken.close()
