"""The one module of the operator that talks to the Kubernetes API, over ``kubernetes_asyncio``.

The library gives the connection: credentials from a kubeconfig or the pod's service account (its
loader is kubectl's: contexts, client certificates, tokens, exec plugins, in-cluster token rotation),
TLS, an aiohttp session (the HTTP stack kopf and the frontend use too) and the raw call. This module adds
what the operator needs on top: the resource types it touches (:data:`KNOWN_TYPES`, so a manifest
finds its URL), server-side apply under the operator's field manager, the JSON, merge and strategic
patches (with subresources: ``status``, ``scale``), deletes guarded by the object's uid, and Events.
Objects stay plain dicts, as ``render`` makes them and the API server sends them.

Errors: any non-2xx answer raises the tree of :mod:`dynamo_api.kube_errors` (``KubeError``, and
``NotFound``, ``Conflict``, ``Invalid`` for 404, 409, 422), the planner's client's too; a connection
that fails raises ``aiohttp.ClientError`` or ``TimeoutError``. :func:`is_rejection` tells an answer no
retry can fix. :func:`timestamp` is the time the operator writes (Events, conditions, readiness gates).
"""

from __future__ import annotations

import datetime
import json
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from dynamo_api.kube_errors import Conflict as Conflict  # the client's errors, for its callers
from dynamo_api.kube_errors import Invalid as Invalid
from dynamo_api.kube_errors import KubeError as KubeError
from dynamo_api.kube_errors import NotFound as NotFound
from dynamo_api.kube_errors import kube_error
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION

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
DYNAMO_MODEL = ResourceType("nvidia.com/v1alpha1", "DynamoModel", "dynamomodels")
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
INFERENCE_POOL = ResourceType("inference.networking.k8s.io/v1", "InferencePool", "inferencepools")  # GAIE
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
        DYNAMO_MODEL,
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
        INFERENCE_POOL,
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


# API answers that a retry cannot fix: the object itself is wrong (or forbidden).
_CLIENT_ERRORS = frozenset({400, 403, 422})
# Server-side apply answers 500 (not 422) when a field has the wrong type, e.g. a string where
# extraPodSpec needs a list: the object is wrong, so no retry can fix it either.
_TYPED_PATCH_ERROR = "failed to create typed patch object"


def is_rejection(exc: KubeError) -> bool:
    """Whether the API server rejected the object itself (fix the spec) rather than failed to serve."""
    return exc.status in _CLIENT_ERRORS or (exc.status == 500 and _TYPED_PATCH_ERROR in exc.message)


def timestamp() -> str:
    """Now, as the API server writes times (RFC 3339, UTC, seconds)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _error(exc: ApiException) -> KubeError:
    """The API server's Status answer as our error type (its reason and message when it sent one)."""
    body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else exc.body
    status, text = int(exc.status or 0), body or ""
    try:
        answer = json.loads(text)
        reason, message = answer.get("reason", ""), answer.get("message", text)
    except (ValueError, AttributeError):
        reason, message = exc.reason or "", text
    return kube_error(status, reason, message)


@dataclass(frozen=True)
class Credentials:
    """Where the API server is and how to authenticate, as loaded from kubeconfig or in-cluster (a
    ``kubernetes_asyncio`` configuration: files for the CA and client certificate, a token that the
    in-cluster loader re-reads as the kubelet rotates it)."""

    configuration: k8s.Configuration

    @property
    def server(self) -> str:
        return str(self.configuration.host)

    @property
    def ca_path(self) -> str | None:
        return self.configuration.ssl_ca_cert or None

    @property
    def cert_path(self) -> str | None:
        return self.configuration.cert_file or None

    @property
    def key_path(self) -> str | None:
        return self.configuration.key_file or None

    @property
    def verify_ssl(self) -> bool:
        return bool(self.configuration.verify_ssl)

    async def authorization(self) -> tuple[str | None, str | None]:
        """``(scheme, token)`` of the Authorization header, when the credentials use one (``Bearer``
        and a token, refreshed in a pod; ``Basic`` for a kubeconfig user with a password)."""
        header = await self.configuration.get_api_key_with_prefix("BearerToken")
        if not header:
            return None, None
        scheme, _, token = header.partition(" ")
        return (scheme, token) if token else ("Bearer", scheme)


async def load_credentials(kubeconfig: Path | None, in_cluster: bool) -> Credentials:
    """Load credentials the way kubectl does: in-cluster service account, or a kubeconfig file
    (``kubeconfig``, else $KUBECONFIG, else ~/.kube/config). Raises ``kubernetes_asyncio``'s
    ``ConfigException`` (or ``OSError``) when there are none."""
    cfg = k8s.Configuration()
    if in_cluster:
        # kubernetes_asyncio leaves load_incluster_config unannotated
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        path = str(kubeconfig) if kubeconfig else KUBE_CONFIG_DEFAULT_LOCATION
        await k8s_config.load_kube_config(config_file=path, client_configuration=cfg, persist_config=False)
    return Credentials(cfg)


# Answers whose body is the object (or list, or Status) we return, decoded as plain JSON.
_AS_JSON = {code: "object" for code in (200, 201, 202)}


class Kube:
    """An async Kubernetes client of plain dicts: get, list, create, server-side apply, patches, delete,
    events.

    Use as ``async with Kube(creds) as kube``. One connection pool (``kubernetes_asyncio.ApiClient``)."""

    def __init__(self, creds: Credentials, *, field_manager: str = FIELD_MANAGER) -> None:
        self._creds = creds
        self._field_manager = field_manager
        self._api: k8s.ApiClient | None = None

    async def __aenter__(self) -> Kube:
        cfg = self._creds.configuration
        cfg.connection_pool_maxsize = 32
        self._api = k8s.ApiClient(cfg)
        self._api.user_agent = self._field_manager
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """The answer's JSON object: the object, a list of them, or a Status."""
        if self._api is None:
            raise RuntimeError("Kube is not open: use `async with Kube(creds) as kube`")
        try:
            answer: dict[str, Any] = await self._api.call_api(
                path,
                method,
                query_params=list((params or {}).items()),
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                response_types_map=_AS_JSON,
                _return_http_data_only=True,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        except ApiException as exc:
            raise _error(exc) from None
        return answer

    # --- reads ---------------------------------------------------------------------------------
    async def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return await self._request("GET", rt.path(namespace, name))
        except NotFound:
            return None

    async def list(
        self, rt: ResourceType, namespace: str | None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        try:
            result = await self._request("GET", rt.path(namespace), params=params)
        except NotFound:  # the type is not installed (e.g. no LeaderWorkerSet CRD)
            return []
        items: list[dict[str, Any]] = result.get("items", [])
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
    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
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

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
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
    ) -> dict[str, Any]:
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
        patch: dict[str, Any],
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> dict[str, Any]:
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
        patch: dict[str, Any],
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
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
        self,
        involved: dict[str, Any],
        *,
        type_: str,
        reason: str,
        message: str,
        component: str = FIELD_MANAGER,
    ) -> None:
        """Post a core/v1 Event about ``involved`` (shown by ``kubectl describe`` and ``get events``).

        Events are best effort: a failure is logged, never raised."""
        meta = involved["metadata"]
        now = timestamp()
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
