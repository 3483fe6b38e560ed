"""The planner's only Kubernetes I/O: read its graph, patch per-service replicas, post Events.

Over ``kubernetes_asyncio``, the operator's client too: credentials from the pod's service account
(the token re-read as the kubelet rotates it), or from a kubeconfig, loaded as kubectl loads them. The
replicas are written by server-side apply under one field manager, ``dynamo-planner``, so
``kubectl get dgd -o yaml --show-managed-fields`` shows who set them. The RBAC the operator renders for
the planner allows exactly these calls: get and patch its own graph (by name), create Events.
"""

from __future__ import annotations

import datetime
import uuid
from typing import TYPE_CHECKING, Any

import aiohttp
from dynamo_api.kube_errors import KubeError, kube_error

if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s

__all__ = ["FIELD_MANAGER", "GraphClient", "KubeError"]

FIELD_MANAGER = "dynamo-planner"
GROUP_VERSION = "nvidia.com/v1alpha1"
TIMEOUT_S = 15.0
_AS_JSON = {code: "object" for code in (200, 201)}


async def _configuration(kubeconfig: str | None) -> k8s.Configuration:
    # Imported here: a planner on a manifest (--graph-file, as dynamo-run runs it) and --help need none.
    from kubernetes_asyncio import client as k8s
    from kubernetes_asyncio import config as k8s_config
    from kubernetes_asyncio.config.config_exception import ConfigException

    cfg = k8s.Configuration()
    if kubeconfig:
        try:
            await k8s_config.load_kube_config(
                config_file=kubeconfig, client_configuration=cfg, persist_config=False
            )
        except (ConfigException, OSError, KeyError, TypeError) as e:
            raise KubeError(0, "", f"Could not load the kubeconfig {kubeconfig}: {e}") from e
        return cfg
    try:  # kubernetes_asyncio leaves load_incluster_config unannotated
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except ConfigException as e:
        raise KubeError(
            0,
            "",
            "No Kubernetes credentials: not in a pod with a service account token, and no --kubeconfig; "
            "run the planner in the graph (the operator gives it a service account) or pass --kubeconfig",
        ) from e
    return cfg


class GraphClient:
    """Get and patch one DynamoGraphDeployment; post Events about it."""

    def __init__(self, namespace: str, graph: str, kubeconfig: str | None = None) -> None:
        self.namespace, self.graph = namespace, graph
        self._kubeconfig = kubeconfig
        self._api: k8s.ApiClient | None = None
        self._path = f"/apis/{GROUP_VERSION}/namespaces/{namespace}/dynamographdeployments/{graph}"

    async def __aenter__(self) -> GraphClient:
        from kubernetes_asyncio.client import ApiClient

        self._api = ApiClient(await _configuration(self._kubeconfig))
        self._api.user_agent = FIELD_MANAGER
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def _call(
        self,
        method: str,
        path: str,
        what: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        from kubernetes_asyncio.client.exceptions import ApiException

        assert self._api is not None, "use `async with GraphClient(...)`"
        try:
            answer = await self._api.call_api(
                path,
                method,
                query_params=list((params or {}).items()),
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                response_types_map=_AS_JSON,
                _return_http_data_only=True,
                _request_timeout=TIMEOUT_S,
            )
        except ApiException as e:
            hint = {
                401: "the credentials were refused",
                403: "the planner's Role must allow it (rendered by the operator for its graph)",
                404: f"graph {self.namespace}/{self.graph} does not exist",
            }.get(int(e.status or 0), "see the message")
            body = e.body.decode(errors="replace") if isinstance(e.body, bytes) else e.body
            detail = (body or e.reason or "")[:300]
            raise kube_error(
                int(e.status or 0), e.reason or "", f"could not {what}: {detail}; {hint}"
            ) from None
        except (aiohttp.ClientError, TimeoutError) as e:
            raise KubeError(0, "", f"Could not {what}: {e!r}; check that the API server is reachable") from e
        return answer if isinstance(answer, dict) else {}

    async def get_graph(self) -> dict[str, Any]:
        return await self._call("GET", self._path, f"get graph {self.namespace}/{self.graph}")

    async def set_replicas(self, replicas: dict[str, int]) -> None:
        """Server-side apply of ``spec.services.<name>.replicas``. Pass every service the planner
        manages, every time: server-side apply removes a field its manager stops sending (a service
        left out would fall back to the default of 1 replica)."""
        body = {
            "apiVersion": GROUP_VERSION,
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": self.graph, "namespace": self.namespace},
            "spec": {"services": {name: {"replicas": n} for name, n in replicas.items()}},
        }
        await self._call(
            "PATCH",
            self._path,
            f"patch replicas of graph {self.namespace}/{self.graph}",
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            body=body,
            content_type="application/apply-patch+yaml",
        )

    async def event(self, graph: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta = graph.get("metadata", {})
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{self.graph}.planner.{uuid.uuid4().hex[:12]}",
                "namespace": self.namespace,
            },
            "involvedObject": {
                "apiVersion": GROUP_VERSION,
                "kind": "DynamoGraphDeployment",
                "name": self.graph,
                "namespace": self.namespace,
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": FIELD_MANAGER},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self._call(
            "POST", f"/api/v1/namespaces/{self.namespace}/events", f"post Event {reason}", body=body
        )
