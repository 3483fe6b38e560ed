"""The conversion webhook: HTTPS ``POST /convert`` answering ``apiextensions.k8s.io/v1`` ConversionReviews,
and the HTTPS server it shares with the validating webhook (``POST /validate``,
:mod:`dynamo_operator.validating_webhook`).

The API server calls it whenever a client reads or writes a ``DynamoGraphDeployment`` at a version other
than the stored one (v1beta1): every v1alpha1 request, in either direction. Conversion itself is
:func:`dynamo_api.conversion.convert`; :func:`review` wraps it in the review protocol (pure).

At start-up the operator writes where the webhook is (a Service, or a URL for a local run) and the CA
bundle it must trust into the CRD's ``spec.conversion`` (:func:`ensure_crd_conversion`), and checks again
every minute, so a ``kubectl apply`` of the CRD file (which resets them) heals by itself.

While the operator is down, requests at v1alpha1 fail with ``conversion webhook for
nvidia.com/v1beta1, Kind=DynamoGraphDeployment failed: ...``; v1beta1 requests (and the operator's own,
and garbage collection) never need it. docs/kubernetes.md
("Two API versions, one conversion webhook") says what users do then.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from dynamo_api import models
from dynamo_api.conversion import ConversionError, convert

from dynamo_operator.certs import ServingCert
from dynamo_operator.reconcile.kube import CRD, Kube, KubeError

__all__ = [
    "CRD_NAME",
    "PATH",
    "WebhookServer",
    "crd_conversion_patch",
    "differs",
    "ensure_crd_conversion",
    "keep_registered",
    "review",
]

logger = logging.getLogger(__name__)

PATH = "/convert"
CRD_NAME = f"{models.PLURAL}.{models.GROUP}"
REVIEW_API_VERSION = "apiextensions.k8s.io/v1"
RECHECK_S = 60.0


def review(body: Any) -> dict[str, Any]:
    """The ConversionReview response to a ConversionReview request (both dicts)."""
    request = body.get("request") if isinstance(body, dict) else None
    if not isinstance(request, dict):
        return {
            "apiVersion": REVIEW_API_VERSION,
            "kind": "ConversionReview",
            "response": {
                "uid": "",
                "result": {
                    "status": "Failure",
                    "message": "expected a ConversionReview with a request (apiextensions.k8s.io/v1)",
                },
            },
        }
    uid = request.get("uid", "")
    desired = request.get("desiredAPIVersion", "")
    try:
        converted = [convert(obj, desired) for obj in request.get("objects") or []]
    except ConversionError as exc:
        logger.warning("Could not convert uid=%s to=%s error=%s", uid, desired, exc)
        result: dict[str, Any] = {"status": "Failure", "message": str(exc)}
        response = {"uid": uid, "result": result}
        return {"apiVersion": REVIEW_API_VERSION, "kind": "ConversionReview", "response": response}
    return {
        "apiVersion": REVIEW_API_VERSION,
        "kind": "ConversionReview",
        "response": {"uid": uid, "convertedObjects": converted, "result": {"status": "Success"}},
    }


def crd_conversion_patch(client_config: dict[str, Any], ca_pem: bytes) -> dict[str, Any]:
    """A merge patch of the CRD pointing its conversion at ``client_config`` (``{"url": ...}`` or
    ``{"service": {...}}``), trusting ``ca_pem``."""
    config: dict[str, Any] = {"url": None, "service": None, **client_config}
    config["caBundle"] = base64.b64encode(ca_pem).decode()
    return {
        "spec": {
            "conversion": {
                "strategy": "Webhook",
                "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": config},
            }
        }
    }


def differs(current: Any, wanted: Any) -> bool:
    """Whether ``current`` lacks anything of ``wanted`` (what the API server added, e.g. defaults, is
    not a difference)."""
    if isinstance(wanted, dict):
        current = current if isinstance(current, dict) else {}
        return any(differs(current.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        current = current if isinstance(current, list) else []
        return len(current) != len(wanted) or any(differs(c, w) for c, w in zip(current, wanted, strict=True))
    return bool(current != wanted)


async def ensure_crd_conversion(kube: Kube, patch: dict[str, Any]) -> bool:
    """Patch the CRD when its conversion settings differ from ``patch``; whether it patched.

    Raises KubeError (403: the operator may not patch the CRD; 404: the CRD is not installed)."""
    crd = await kube.get(CRD, None, CRD_NAME)
    if crd is None:
        raise KubeError(
            404, "NotFound", f"the CRD {CRD_NAME} is not installed: apply crds/ (or install the chart) first"
        )
    if not differs(crd, patch):
        return False
    await kube.patch_merge(CRD, None, CRD_NAME, patch)
    logger.info("Configured conversion webhook crd=%s clientConfig=%s", CRD_NAME, _where(patch))
    return True


def _where(patch: dict[str, Any]) -> str:
    config = patch["spec"]["conversion"]["webhook"]["clientConfig"]
    if config.get("url"):
        return str(config["url"])
    svc = config["service"]
    return f"service {svc['namespace']}/{svc['name']}:{svc.get('port', 443)}{svc.get('path', '')}"


async def keep_registered(
    checks: list[tuple[str, Callable[[], Awaitable[Any]]]], interval_s: float = RECHECK_S
) -> None:
    """Run each ``(what, check)`` every ``interval_s`` (until cancelled): the CRD's conversion settings and
    the validating webhook's registration, which a ``kubectl apply`` or ``helm upgrade`` may reset."""
    while True:
        await asyncio.sleep(interval_s)
        for what, check in checks:
            try:
                await check()
            except (KubeError, OSError, TimeoutError) as exc:
                logger.warning("Could not check the %s error=%s", what, exc)


class WebhookServer:
    """The HTTPS server of ``POST /convert`` and, given ``validate`` (an AdmissionReview -> its answer),
    ``POST /validate`` (aiohttp), started and stopped with the operator."""

    def __init__(
        self,
        cert: ServingCert,
        host: str,
        port: int,
        validate: Callable[[Any], dict[str, Any]] | None = None,
        validate_path: str = "/validate",
    ) -> None:
        self.cert = cert
        self.host = host
        self.port = port
        self.validate = validate
        self.validate_path = validate_path
        self._runner: web.AppRunner | None = None

    async def _convert(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response(review(None), status=400)
        return web.json_response(review(body))

    async def _validate(self, request: web.Request) -> web.Response:
        assert self.validate is not None
        try:
            body = await request.json()
        except ValueError:
            return web.json_response(self.validate(None), status=400)
        return web.json_response(self.validate(body))

    async def start(self) -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(str(self.cert.cert_path), str(self.cert.key_path))
        app = web.Application(client_max_size=32 * 1024 * 1024)  # a list conversion holds many objects
        app.router.add_post(PATH, self._convert)
        if self.validate is not None:
            app.router.add_post(self.validate_path, self._validate)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=ctx)
        await site.start()
        paths = PATH + (f" and {self.validate_path}" if self.validate is not None else "")
        logger.info("Serving webhooks address=https://%s:%d paths=%s", self.host, self.port, paths)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
