"""NIXL over RDMA: what a pod needs so KV transfer between prefill and decode uses RDMA, not TCP.

Opt in with the annotation ``nvidia.com/rdma: "true"`` on the DynamoGraphDeployment (every GPU
worker of the graph) or in a service's ``annotations`` (that service; ``"false"`` opts a service out
of a graph-wide setting); the annotations are declared in ``dynamo_api.annotations``. An
RDMA-enabled pod gets:

- the ``IPC_LOCK`` capability (RDMA pins memory),
- ``<rdma_resource_name>: <rdma_resource_count>`` in requests and limits (``rdma/ib: 1`` by default,
  operator flags change both),
- ``UCX_TLS`` (operator default, or the annotation ``nvidia.com/ucx-tls``) and, when the annotation
  ``nvidia.com/ucx-net-devices`` is set (e.g. ``mlx5_0:1``), ``UCX_NET_DEVICES``,
- with ``nvidia.com/rdma-host-network: "true"``, ``hostNetwork: true`` and
  ``dnsPolicy: ClusterFirstWithHostNet``.

NIXL silently falls back to TCP when a pod has no RDMA device, so the renderer always states which
transport the disaggregated pods were configured for (Notice ``RdmaTransport``, ``TcpTransport`` or
``MixedTransport``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dynamo_api.annotations import (
    HOST_NETWORK_ANNOTATION,
    UCX_NET_DEVICES_ANNOTATION,
    UCX_TLS_ANNOTATION,
    parse_bool,
)

__all__ = ["RdmaSettings", "apply_rdma"]


@dataclass(frozen=True)
class RdmaSettings:
    resource_name: str
    resource_count: int
    ucx_tls: str
    ucx_net_devices: str | None
    host_network: bool

    @classmethod
    def from_annotations(
        cls,
        graph: Mapping[str, str],
        service: Mapping[str, str],
        *,
        resource_name: str,
        resource_count: int,
        default_ucx_tls: str,
    ) -> RdmaSettings:
        """Settings from the annotations (service wins over graph). Raises ValueError on a bad bool."""

        def pick(key: str) -> str | None:
            return service.get(key, graph.get(key))

        return cls(
            resource_name=resource_name,
            resource_count=resource_count,
            ucx_tls=pick(UCX_TLS_ANNOTATION) or default_ucx_tls,
            ucx_net_devices=pick(UCX_NET_DEVICES_ANNOTATION),
            host_network=bool(parse_bool(pick(HOST_NETWORK_ANNOTATION))),
        )

    def describe(self) -> str:
        parts = [f"IPC_LOCK, {self.resource_count} x {self.resource_name}", f"UCX_TLS={self.ucx_tls}"]
        if self.ucx_net_devices:
            parts.append(f"UCX_NET_DEVICES={self.ucx_net_devices}")
        if self.host_network:
            parts.append("hostNetwork")
        return ", ".join(parts)


def _set_env(env: list[dict[str, Any]], name: str, value: str) -> None:
    for item in env:
        if item.get("name") == name:
            return  # the user's own setting wins
    env.append({"name": name, "value": value})


def apply_rdma(pod_spec: dict[str, Any], settings: RdmaSettings) -> dict[str, Any]:
    """The pod spec with its ``main`` container wired for NIXL over RDMA."""
    out = copy.deepcopy(pod_spec)
    for container in out["containers"]:
        if container.get("name") != "main":
            continue
        security = container.setdefault("securityContext", {})
        capabilities = security.setdefault("capabilities", {})
        added = capabilities.setdefault("add", [])
        if "IPC_LOCK" not in added:
            added.append("IPC_LOCK")
        resources = container.setdefault("resources", {})
        requests = resources.setdefault("requests", {})
        limits = resources.setdefault("limits", {})
        # Extended resources need requests == limits; a count the user set wins.
        count = limits.get(settings.resource_name) or requests.get(settings.resource_name)
        requests[settings.resource_name] = limits[settings.resource_name] = count or str(
            settings.resource_count
        )
        env = container.setdefault("env", [])
        _set_env(env, "UCX_TLS", settings.ucx_tls)
        if settings.ucx_net_devices:
            _set_env(env, "UCX_NET_DEVICES", settings.ucx_net_devices)
    if settings.host_network:
        out["hostNetwork"] = True
        out["dnsPolicy"] = "ClusterFirstWithHostNet"
    return out
