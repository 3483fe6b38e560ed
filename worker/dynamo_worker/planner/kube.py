"""The planner's only Kubernetes I/O: read its graph, patch per-service replicas, post Events.

A small aiohttp client (the worker image carries no Kubernetes client library): credentials from the
pod's service account, or from a kubeconfig (server, CA, and a token or a client certificate). The
replicas are written by server-side apply under one field manager, ``dynamo-planner``, so
``kubectl get dgd -o yaml --show-managed-fields`` shows who set them. The RBAC the operator renders for
the planner allows exactly these calls: get and patch its own graph (by name), create Events.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import ssl
import tempfile
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import yaml

__all__ = ["FIELD_MANAGER", "GraphClient", "KubeError"]

FIELD_MANAGER = "dynamo-planner"
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
GROUP_VERSION = "nvidia.com/v1alpha1"
TIMEOUT_S = 15.0


class KubeError(RuntimeError):
    """An API call that failed; the message names the call, the status and what to check."""


def _ssl_from_kubeconfig(path: str) -> tuple[str, ssl.SSLContext, dict[str, str]]:
    cfg = yaml.safe_load(Path(path).read_text())
    ctx_name = cfg.get("current-context")
    context = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in cfg["users"] if u["name"] == context["user"])
    base = Path(path).parent
    ctx = ssl.create_default_context()
    if "certificate-authority-data" in cluster:
        ctx.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    elif "certificate-authority" in cluster:
        ctx.load_verify_locations(str(base / cluster["certificate-authority"]))
    headers = {}
    if user.get("token"):
        headers["Authorization"] = f"Bearer {user['token']}"
    elif user.get("client-certificate"):
        ctx.load_cert_chain(str(base / user["client-certificate"]), str(base / user["client-key"]))
    elif user.get("client-certificate-data"):
        with tempfile.TemporaryDirectory() as d:
            cert, key = Path(d) / "c", Path(d) / "k"
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            ctx.load_cert_chain(str(cert), str(key))
    return cluster["server"].rstrip("/"), ctx, headers


def _in_cluster() -> tuple[str, ssl.SSLContext, dict[str, str]]:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    token = SA_DIR / "token"
    if not host or not token.is_file():
        raise KubeError(
            "No Kubernetes credentials: not in a pod with a service account token, and no --kubeconfig; "
            "run the planner in the graph (the operator gives it a service account) or pass --kubeconfig"
        )
    ctx = ssl.create_default_context(cafile=str(SA_DIR / "ca.crt"))
    return f"https://{host}:{port}", ctx, {"Authorization": f"Bearer {token.read_text().strip()}"}


class GraphClient:
    """Get and patch one DynamoGraphDeployment; post Events about it."""

    def __init__(self, namespace: str, graph: str, kubeconfig: str | None = None) -> None:
        self.namespace, self.graph = namespace, graph
        self._server, self._ssl, self._headers = (
            _ssl_from_kubeconfig(kubeconfig) if kubeconfig else _in_cluster()
        )
        self._session: aiohttp.ClientSession | None = None
        self._path = f"/apis/{GROUP_VERSION}/namespaces/{namespace}/dynamographdeployments/{graph}"

    async def __aenter__(self) -> GraphClient:
        self._session = aiohttp.ClientSession(
            headers=self._headers,
            timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
            connector=aiohttp.TCPConnector(ssl=self._ssl),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(self, method: str, path: str, what: str, **kw: Any) -> dict[str, Any]:
        assert self._session is not None
        try:
            async with self._session.request(method, self._server + path, **kw) as r:
                body = await r.text()
                if r.status >= 300:
                    hint = {
                        401: "the credentials were refused",
                        403: "the planner's Role must allow it (rendered by the operator for its graph)",
                        404: f"graph {self.namespace}/{self.graph} does not exist",
                    }.get(r.status, "see the message")
                    raise KubeError(f"Could not {what}: HTTP {r.status} {body[:300]}; {hint}")
                return json.loads(body) if body else {}
        except (aiohttp.ClientError, TimeoutError) as e:
            raise KubeError(f"Could not {what}: {e!r}; check that the API server is reachable") from e

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
            data=json.dumps(body),
            headers={"Content-Type": "application/apply-patch+yaml"},
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
            "POST", f"/api/v1/namespaces/{self.namespace}/events", f"post Event {reason}", json=body
        )
