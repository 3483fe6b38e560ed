"""The annotations the operator reads on a DynamoGraphDeployment (``metadata.annotations``, every
service) or on one service (``spec.services.<name>.annotations``, which wins). Pure.

- ``nvidia.com/rdma: "true"|"false"``: NIXL over RDMA for the GPU workers (``backends.nixl``);
- ``nvidia.com/rdma-host-network: "true"|"false"``: RDMA pods on the host network;
- ``nvidia.com/ucx-tls``, ``nvidia.com/ucx-net-devices``: UCX_TLS / UCX_NET_DEVICES of RDMA pods;
- ``nvidia.com/dynamo-worker-module``: run ``dynamo_worker.sglang`` or ``dynamo_worker.mocker`` where
  the manifest runs ``dynamo.sglang`` (``backends.sglang``).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "BOOL_ANNOTATIONS",
    "HOST_NETWORK_ANNOTATION",
    "MODULE_ANNOTATION",
    "RDMA_ANNOTATION",
    "UCX_NET_DEVICES_ANNOTATION",
    "UCX_TLS_ANNOTATION",
    "parse_bool",
]

RDMA_ANNOTATION: Final = "nvidia.com/rdma"
HOST_NETWORK_ANNOTATION: Final = "nvidia.com/rdma-host-network"
UCX_TLS_ANNOTATION: Final = "nvidia.com/ucx-tls"
UCX_NET_DEVICES_ANNOTATION: Final = "nvidia.com/ucx-net-devices"
MODULE_ANNOTATION: Final = "nvidia.com/dynamo-worker-module"
# Annotations whose value must be a boolean (see ``parse_bool``).
BOOL_ANNOTATIONS: Final = (RDMA_ANNOTATION, HOST_NETWORK_ANNOTATION)


def parse_bool(value: str | None) -> bool | None:
    """``"true"``/``"false"`` (any case; also 1/0, yes/no) as a bool; None when absent; else ValueError."""
    if value is None:
        return None
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(value)
