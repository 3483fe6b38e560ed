"""The one module that talks to the Kubernetes API: a thin async REST client over aiohttp.

Credentials come from a kubeconfig file or the in-cluster service account (loaded with the
``kubernetes`` package's config loader, the same files ``kubectl`` uses). Objects are plain dicts.

Errors::

    KubeError            any non-2xx answer; .status, .reason, .message
    ├── NotFound         404
    ├── Conflict         409
    └── Invalid          422 (the object was rejected by validation or admission)
"""

from __future__ import annotations

import datetime
import json
import logging
import ssl
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

logger = logging.getLogger(__name__)

FIELD_MANAGER = "dynamo-sglang-operator"
REQUEST_TIMEOUT_S = 30.0
# The operations of a JSON patch (RFC 6902). A name of its own also because inside ``Kube``, whose
# ``list`` method shadows the builtin, ``list[dict]`` does not name a type.
JsonPatch = list[dict[str, Any]]


@dataclass(frozen=True)
class ResourceType:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced:
            if namespace is None:
                raise ValueError(f"{self.kind} is namespaced: a namespace is required")
            base += f"/namespaces/{namespace}"
        path = f"{base}/{self.plural}"
        if name is not None:
            path += f"/{name}"
        if subresource is not None:
            path += f"/{subresource}"
        return path


# The stored version: reading and writing it never needs the conversion webhook.
DGD = ResourceType("nvidia.com/v1beta1", "DynamoGraphDeployment", "dynamographdeployments")
SCALING_ADAPTER = ResourceType(
    "nvidia.com/v1alpha1", "DynamoGraphDeploymentScalingAdapter", "dynamographdeploymentscalingadapters"
)
DEPLOYMENT = ResourceType("apps/v1", "Deployment", "deployments")
STATEFULSET = ResourceType("apps/v1", "StatefulSet", "statefulsets")
SERVICE = ResourceType("v1", "Service", "services")
POD = ResourceType("v1", "Pod", "pods")
EVENT = ResourceType("v1", "Event", "events")
PVC = ResourceType("v1", "PersistentVolumeClaim", "persistentvolumeclaims")
SERVICE_ACCOUNT = ResourceType("v1", "ServiceAccount", "serviceaccounts")
ROLE = ResourceType("rbac.authorization.k8s.io/v1", "Role", "roles")
ROLE_BINDING = ResourceType("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings")
LWS = ResourceType("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets")
CRD = ResourceType(
    "apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", namespaced=False
)
PDB = ResourceType("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
POD_GROUP = ResourceType("scheduling.x-k8s.io/v1alpha1", "PodGroup", "podgroups")  # scheduler-plugins
VALIDATING_WEBHOOK = ResourceType(
    "admissionregistration.k8s.io/v1",
    "ValidatingWebhookConfiguration",
    "validatingwebhookconfigurations",
    namespaced=False,
)

KNOWN_TYPES: dict[tuple[str, str], ResourceType] = {
    (t.api_version, t.kind): t
    for t in (
        DGD,
        SCALING_ADAPTER,
        DEPLOYMENT,
        STATEFULSET,
        SERVICE,
        POD,
        EVENT,
        PVC,
        LWS,
        CRD,
        SERVICE_ACCOUNT,
        ROLE,
        ROLE_BINDING,
        PDB,
        POD_GROUP,
        VALIDATING_WEBHOOK,
    )
}

LWS_CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"
POD_GROUP_CRD_NAME = "podgroups.scheduling.x-k8s.io"


def resource_type(api_version: str, kind: str) -> ResourceType:
    try:
        return KNOWN_TYPES[(api_version, kind)]
    except KeyError:
        raise ValueError(
            f"The operator does not know the Kubernetes type {api_version}/{kind}; "
            "add it to dynamo_operator.reconcile.kube.KNOWN_TYPES"
        ) from None


class KubeError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Invalid(KubeError):
    pass


_ERRORS: dict[int, type[KubeError]] = {404: NotFound, 409: Conflict, 422: Invalid}


@dataclass(frozen=True)
class Credentials:
    """Where the API server is and how to authenticate, as loaded from kubeconfig or in-cluster."""

    server: str
    ca_path: str | None
    cert_path: str | None
    key_path: str | None
    verify_ssl: bool
    token: Callable[[], str | None]


def load_credentials(kubeconfig: Path | None, in_cluster: bool) -> Credentials:
    """Load credentials the way kubectl does: in-cluster service account, or a kubeconfig file
    (``kubeconfig``, else $KUBECONFIG, else ~/.kube/config)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    if in_cluster:
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(
            config_file=str(kubeconfig) if kubeconfig else None,
            client_configuration=cfg,
            persist_config=False,
        )

    def token() -> str | None:
        if cfg.refresh_api_key_hook is not None:
            cfg.refresh_api_key_hook(cfg)
        header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
        if not header:
            return None
        return header.split(" ", 1)[-1]

    return Credentials(
        server=cfg.host.rstrip("/"),
        ca_path=cfg.ssl_ca_cert or None,
        cert_path=cfg.cert_file or None,
        key_path=cfg.key_file or None,
        verify_ssl=bool(cfg.verify_ssl),
        token=token,
    )


def _ssl_context(creds: Credentials) -> ssl.SSLContext | bool:
    if not creds.server.startswith("https"):
        return False
    ctx = ssl.create_default_context(cafile=creds.ca_path)
    if not creds.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if creds.cert_path and creds.key_path:
        ctx.load_cert_chain(creds.cert_path, creds.key_path)
    return ctx


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Kube:
    """A minimal async Kubernetes client: get, list, create, server-side apply, patches, delete, events.

    Use as ``async with Kube(creds) as kube``. One aiohttp session with connection reuse.
    """

    def __init__(self, creds: Credentials, *, field_manager: str = FIELD_MANAGER) -> None:
        self._creds = creds
        self._field_manager = field_manager
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Kube:
        connector = aiohttp.TCPConnector(ssl=_ssl_context(self._creds), limit=32)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        if self._session is None:
            raise RuntimeError("Kube is not open: use `async with Kube(creds) as kube`")
        headers = {"Accept": "application/json"}
        token = self._creds.token()  # a file read at most (in-cluster token rotation)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body, separators=(",", ":"))
        url = self._creds.server + path
        async with self._session.request(method, url, params=params, data=data, headers=headers) as resp:
            text = await resp.text()
            if resp.status >= 400:
                try:
                    status = json.loads(text)
                    reason, message = status.get("reason", ""), status.get("message", text)
                except ValueError:
                    reason, message = resp.reason or "", text
                raise _ERRORS.get(resp.status, KubeError)(resp.status, reason, message)
            return json.loads(text) if text else None

    # --- reads ---------------------------------------------------------------------------------
    async def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict | None:
        try:
            return await self._request("GET", rt.path(namespace, name))
        except NotFound:
            return None

    async def list(
        self, rt: ResourceType, namespace: str | None, label_selector: str | None = None
    ) -> list[dict]:
        params = {"labelSelector": label_selector} if label_selector else None
        try:
            result = await self._request("GET", rt.path(namespace), params=params)
        except NotFound:  # the type is not installed (e.g. no LeaderWorkerSet CRD)
            return []
        items = result.get("items", [])
        for item in items:  # lists drop apiVersion/kind from items; put them back
            item.setdefault("apiVersion", rt.api_version)
            item.setdefault("kind", rt.kind)
        return items

    async def crd_established(self, name: str) -> bool:
        crd = await self.get(CRD, None, name)
        if crd is None:
            return False
        conditions = crd.get("status", {}).get("conditions", [])
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    # --- writes --------------------------------------------------------------------------------
    async def apply(self, obj: dict) -> dict:
        """Server-side apply of a full manifest, taking ownership of conflicting fields (force)."""
        rt = resource_type(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        return await self._request(
            "PATCH",
            rt.path(meta.get("namespace"), meta["name"]),
            params={"fieldManager": self._field_manager, "force": "true"},
            body=obj,
            content_type="application/apply-patch+yaml",
        )

    async def create(self, obj: dict) -> dict:
        """Create ``obj`` (POST); raises :class:`Conflict` when it already exists."""
        rt = resource_type(obj["apiVersion"], obj["kind"])
        return await self._request(
            "POST",
            rt.path(obj["metadata"].get("namespace")),
            params={"fieldManager": self._field_manager},
            body=obj,
        )

    async def patch_json(
        self, rt: ResourceType, namespace: str | None, name: str, ops: JsonPatch, *, field_manager: str
    ) -> dict:
        """A JSON patch (RFC 6902); a failed ``test`` operation answers 422 (:class:`Invalid`)."""
        return await self._request(
            "PATCH",
            rt.path(namespace, name),
            params={"fieldManager": field_manager},
            body=ops,
            content_type="application/json-patch+json",
        )

    async def patch_merge(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        patch: dict,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> dict:
        return await self._request(
            "PATCH",
            rt.path(namespace, name, subresource),
            params={"fieldManager": field_manager or self._field_manager},
            body=patch,
            content_type="application/merge-patch+json",
        )

    async def patch_strategic(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        patch: dict,
        *,
        subresource: str | None = None,
    ) -> dict:
        """A strategic merge patch (built-in kinds): lists with a merge key, such as a pod's
        ``status.conditions`` (by ``type``), are merged item by item instead of replaced."""
        return await self._request(
            "PATCH",
            rt.path(namespace, name, subresource),
            params={"fieldManager": self._field_manager},
            body=patch,
            content_type="application/strategic-merge-patch+json",
        )

    async def delete(
        self, rt: ResourceType, namespace: str | None, name: str, *, uid: str | None = None
    ) -> bool:
        """Delete (background propagation); with ``uid``, only that incarnation. False when gone."""
        body: dict[str, Any] = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self._request("DELETE", rt.path(namespace, name), body=body)
        except NotFound:
            return False
        except Conflict:  # the uid precondition failed: a newer incarnation exists
            return False
        return True

    async def post_event(
        self, involved: dict, *, type_: str, reason: str, message: str, component: str = FIELD_MANAGER
    ) -> None:
        """Post a core/v1 Event about ``involved`` (shown by ``kubectl describe`` and ``get events``).

        Events are best effort: a failure is logged, never raised."""
        meta = involved["metadata"]
        now = _now()
        event: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
                "namespace": meta.get("namespace") or "default",
            },
            "involvedObject": {
                "apiVersion": involved["apiVersion"],
                "kind": involved["kind"],
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": component},
            "reportingComponent": component,
            "reportingInstance": component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._request("POST", EVENT.path(event["metadata"]["namespace"]), body=event)
        except (KubeError, aiohttp.ClientError, TimeoutError) as exc:
            logger.warning("Could not post Event reason=%s object=%s error=%s", reason, meta["name"], exc)


def label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
