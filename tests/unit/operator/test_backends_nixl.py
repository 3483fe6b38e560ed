"""NIXL/RDMA pod wiring: settings from graph and service annotations, and what an RDMA-enabled pod
gets (IPC_LOCK, the RDMA resource, UCX env, host network), without overriding the user's own values."""

from __future__ import annotations

from dynamo_operator.backends import nixl


def _settings(graph: dict, service: dict) -> nixl.RdmaSettings:
    return nixl.RdmaSettings.from_annotations(
        graph, service, resource_name="rdma/hca", resource_count=2, default_ucx_tls="rc,cuda_copy"
    )


def test_service_annotations_win_over_graph():
    settings = _settings(
        {"nvidia.com/ucx-tls": "tcp", "nvidia.com/rdma-host-network": "true"},
        {"nvidia.com/ucx-tls": "rc", "nvidia.com/ucx-net-devices": "mlx5_1:1"},
    )
    assert settings == nixl.RdmaSettings("rdma/hca", 2, "rc", "mlx5_1:1", True)
    assert _settings({}, {}) == nixl.RdmaSettings("rdma/hca", 2, "rc,cuda_copy", None, False)


def test_apply_rdma_keeps_user_values():
    pod = {
        "containers": [
            {
                "name": "main",
                "env": [{"name": "UCX_TLS", "value": "all"}],
                "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}},
                "resources": {"limits": {"nvidia.com/gpu": "8", "rdma/hca": "4"}},
            },
            {"name": "sidecar"},
        ]
    }
    out = nixl.apply_rdma(pod, _settings({}, {"nvidia.com/ucx-net-devices": "mlx5_0:1"}))
    assert out == {
        "containers": [
            {
                "name": "main",
                "env": [
                    {"name": "UCX_TLS", "value": "all"},
                    {"name": "UCX_NET_DEVICES", "value": "mlx5_0:1"},
                ],
                "securityContext": {"capabilities": {"add": ["SYS_PTRACE", "IPC_LOCK"]}},
                "resources": {
                    "limits": {"nvidia.com/gpu": "8", "rdma/hca": "4"},
                    "requests": {"rdma/hca": "4"},
                },
            },
            {"name": "sidecar"},
        ]
    }
    assert "hostNetwork" not in out
    assert pod["containers"][0]["env"] == [{"name": "UCX_TLS", "value": "all"}], "input unchanged"
