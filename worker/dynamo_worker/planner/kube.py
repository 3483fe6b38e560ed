"""The planner's only Kubernetes I/O: read its graph, patch per-service replicas, post Events.

Through the operator's client (:mod:`dynamo_clients.kube`), imported only when the planner talks to
Kubernetes. The replicas are written by server-side apply under one field manager, ``dynamo-planner``,
so ``kubectl get dgd -o yaml --show-managed-fields`` shows who set them. The RBAC the operator renders
for the planner allows exactly these calls: get and patch its own graph (by name), create Events.
"""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
from dynamo_api.kube_errors import KubeError, kube_error

if TYPE_CHECKING:
    from dynamo_clients.kube import Kube, ResourceType

__all__ = ["FIELD_MANAGER", "GraphClient", "KubeError"]

FIELD_MANAGER = "dynamo-planner"
GROUP_VERSION = "nvidia.com/v1alpha1"
KIND = "DynamoGraphDeployment"
T = TypeVar("T")


class GraphClient:
    """Get and patch one DynamoGraphDeployment; post Events about it."""

    def __init__(self, namespace: str, graph: str, kubeconfig: str | None = None) -> None:
        self.namespace, self.graph = namespace, graph
        self._kubeconfig = kubeconfig
        self._kube: Kube  # and the graph's type: set by ``async with``
        self._type: ResourceType

    async def __aenter__(self) -> GraphClient:
        from dynamo_clients import kube  # here: --graph-file and --help need no Kubernetes client

        path = Path(self._kubeconfig) if self._kubeconfig else None
        creds = await kube.load_credentials(path, in_cluster=path is None)
        self._type = kube.ResourceType(GROUP_VERSION, KIND, "dynamographdeployments")
        types = {(t.api_version, t.kind): t for t in (self._type, kube.EVENT)}
        client = kube.Kube(
            creds, field_manager=FIELD_MANAGER, resource_type=lambda *t: types[t], timeout_s=15.0
        )
        self._kube = await client.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._kube.__aexit__(*exc)

    async def _call(self, what: str, call: Awaitable[T]) -> T:
        """``call``'s answer; its failure as a ``KubeError`` that says what to do."""
        try:
            return await call
        except KubeError as e:
            hint = {
                401: "the credentials were refused",
                403: "the planner's Role must allow it (rendered by the operator for its graph)",
                404: f"graph {self.namespace}/{self.graph} does not exist",
            }.get(e.status, "see the message")
            raise kube_error(e.status, e.reason, f"could not {what}: {e.message[:300]}; {hint}") from None
        except (aiohttp.ClientError, TimeoutError) as e:
            raise KubeError(0, "", f"Could not {what}: {e!r}; check that the API server is reachable") from e

    async def get_graph(self) -> dict[str, Any]:
        what = f"get graph {self.namespace}/{self.graph}"
        graph = await self._call(what, self._kube.get(self._type, self.namespace, self.graph))
        if graph is None:
            raise kube_error(
                404, "NotFound", f"could not {what}: graph {self.namespace}/{self.graph} does not exist"
            )
        return graph

    async def set_replicas(self, replicas: dict[str, int]) -> None:
        """Server-side apply of ``spec.services.<name>.replicas``. Pass every service the planner
        manages, every time: server-side apply removes a field its manager stops sending (a service
        left out would fall back to the default of 1 replica)."""
        body = {
            "apiVersion": GROUP_VERSION,
            "kind": KIND,
            "metadata": {"name": self.graph, "namespace": self.namespace},
            "spec": {"services": {name: {"replicas": n} for name, n in replicas.items()}},
        }
        await self._call(f"patch replicas of graph {self.namespace}/{self.graph}", self._kube.apply(body))

    async def event(self, graph: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        uid = (graph.get("metadata") or {}).get("uid")
        meta = {"name": self.graph, "namespace": self.namespace, "uid": uid}
        involved = {"apiVersion": GROUP_VERSION, "kind": KIND, "metadata": meta}
        posted = self._kube.post_event(
            involved, type_=type_, reason=reason, message=message, best_effort=False
        )
        await self._call(f"post Event {reason}", posted)
