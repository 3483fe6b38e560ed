"""The validating admission webhook: HTTPS ``POST /validate`` answering ``admission.k8s.io/v1``
AdmissionReviews for DynamoGraphDeployments and DynamoModels, beside the conversion webhook on the same
server.

It refuses at ``kubectl apply`` what the operator would refuse at reconcile: :func:`judge` renders the
graph with the operator's own configuration, and every ``Problem`` of ``render`` (the semantic checks
of :mod:`dynamo_api.validation` and the configuration-dependent ones) is a refusal naming the
field and the fix; every warning notice is an admission warning (``kubectl`` prints ``Warning: ...``)
and the graph is stored. A DynamoModel is judged by :func:`dynamo_api.dynamo_model.problems` (a
``lora`` without ``source.uri``, an unsupported source, an adapter name with ``:``); a ``file://``
path relative to a manifest is a warning (only dynamo-run resolves it). An update that leaves ``spec``
as it was (labels, annotations, finalizers) and an object being deleted are always allowed, so a graph
stored before the webhook existed can still be edited and deleted.

The operator registers the webhook itself (:func:`ensure_validating_webhook`, re-checked every minute
with the conversion settings): a ValidatingWebhookConfiguration for CREATE and UPDATE of
``nvidia.com/v1beta1`` DynamoGraphDeployments (``matchPolicy: Equivalent``, so requests at v1alpha1
reach it converted) and ``v1alpha1`` DynamoModels, scoped by a namespace selector to the namespaces the
operator watches, pointed at its Service (chart) or URL (``--webhook-url``, an operator outside the
cluster) with the CA bundle it serves. ``failurePolicy`` is ``--webhook-failure-policy``: with
``Ignore`` (the default) a graph applied while the operator is down is stored unvalidated and judged
(condition + Event) when it is back; with ``Fail`` every create and update is refused until it is back.
docs/kubernetes.md ("Validating webhook") says more.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from dynamo_api import dynamo_model, models
from dynamo_api.conversion import load_graph
from pydantic import ValidationError

from dynamo_operator.config import OperatorConfig
from dynamo_operator.reconcile.conditions import problems_from_validation
from dynamo_operator.reconcile.kube import VALIDATING_WEBHOOK, Kube, KubeError
from dynamo_operator.reconcile.model_endpoints import cluster_problems
from dynamo_operator.render import labels, render
from dynamo_operator.webhook import differs

__all__ = [
    "PATH",
    "WEBHOOK_NAME",
    "Verdict",
    "admission_review",
    "ensure_validating_webhook",
    "forbidden",
    "judge",
    "judge_model",
    "validating_webhook_configuration",
]

logger = logging.getLogger(__name__)

PATH: Final = "/validate"
WEBHOOK_NAME: Final = f"validate.{models.PLURAL}.{models.GROUP}"
REVIEW_API_VERSION: Final = "admission.k8s.io/v1"
TIMEOUT_S: Final = 10


@dataclass(frozen=True)
class Verdict:
    refusals: list[str] = field(default_factory=list)  # "field: message", each naming the fix
    warnings: list[str] = field(default_factory=list)


def judge_model(obj: dict[str, Any]) -> Verdict:
    """What the operator makes of ``obj``, a raw DynamoModel: its refusals and warnings."""
    try:
        dm = dynamo_model.DynamoModel.model_validate(obj)
    except ValidationError as exc:
        return Verdict([f"{p.field}: {p.message}" for p in problems_from_validation(exc)])
    return Verdict(
        [f"{p.field}: {p.message}" for p in dynamo_model.problems(dm)],
        [f"{p.field}: {p.message}" for p in cluster_problems(dm)],
    )


def judge(obj: dict[str, Any], config: OperatorConfig) -> Verdict:
    """What the operator makes of ``obj`` (a raw graph of either version, or a DynamoModel): its refusals
    and warnings."""
    if obj.get("kind") == dynamo_model.KIND:
        return judge_model(obj)
    meta = obj.get("metadata") or {}
    if not meta.get("name") and meta.get("generateName"):  # named by the API server after admission
        obj = {**obj, "metadata": {**meta, "name": f"{meta['generateName']}x"}}
    try:
        dgd = load_graph(obj)
    except ValidationError as exc:
        return Verdict([f"{p.field}: {p.message}" for p in problems_from_validation(exc)])
    rendered = render(dgd, config)
    return Verdict(
        [f"{p.field}: {p.message}" for p in rendered.problems],
        [n.message for n in rendered.notices if n.warning],
    )


def _review(response: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response}


def admission_review(body: Any, decide: Callable[[dict[str, Any]], Verdict]) -> dict[str, Any]:
    """The AdmissionReview response to an AdmissionReview request; ``decide`` judges the new object."""
    request = body.get("request") if isinstance(body, dict) else None
    if not isinstance(request, dict):
        return _review(
            {
                "uid": "",
                "allowed": False,
                "status": {
                    "code": 400,
                    "message": "expected an AdmissionReview with a request (admission.k8s.io/v1)",
                },
            }
        )
    uid = request.get("uid", "")
    obj, old = request.get("object"), request.get("oldObject")
    if (
        request.get("operation") not in ("CREATE", "UPDATE")
        or not isinstance(obj, dict)
        or (obj.get("metadata") or {}).get("deletionTimestamp")
        or (isinstance(old, dict) and old.get("spec") == obj.get("spec"))
    ):
        return _review({"uid": uid, "allowed": True})
    verdict = decide(obj)
    response: dict[str, Any] = {"uid": uid, "allowed": not verdict.refusals}
    if verdict.refusals:
        name = (obj.get("metadata") or {}).get("name") or "(new)"
        kind = obj.get("kind") or models.KIND
        message = f"{kind} {name} cannot run: " + "; ".join(verdict.refusals)
        logger.info(
            "Refused kind=%s name=%s/%s problems=%d",
            kind,
            request.get("namespace"),
            name,
            len(verdict.refusals),
        )
        response["status"] = {"code": 422, "reason": "Invalid", "message": message}
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    return _review(response)


def validating_webhook_configuration(
    name: str,
    client_config: dict[str, Any],
    ca_pem: bytes,
    failure_policy: str,
    namespaces: Sequence[str] = (),
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration that sends graphs and DynamoModels (of ``namespaces``; empty:
    all) to /validate."""
    selector: dict[str, Any] = {}
    if namespaces:
        selector = {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": sorted(namespaces)}
            ]
        }
    return {
        "apiVersion": VALIDATING_WEBHOOK.api_version,
        "kind": VALIDATING_WEBHOOK.kind,
        "metadata": {"name": name, "labels": {labels.MANAGED_BY: labels.MANAGED_BY_VALUE}},
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "clientConfig": {**client_config, "caBundle": base64.b64encode(ca_pem).decode()},
                "rules": [
                    {
                        "apiGroups": [models.GROUP],
                        "apiVersions": [models.STORAGE_VERSION],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [models.PLURAL],
                        "scope": "Namespaced",
                    },
                    {
                        "apiGroups": [models.GROUP],
                        "apiVersions": [dynamo_model.VERSION],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [dynamo_model.PLURAL],
                        "scope": "Namespaced",
                    },
                ],
                "matchPolicy": "Equivalent",
                "namespaceSelector": selector,
                "failurePolicy": failure_policy,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": TIMEOUT_S,
            }
        ],
    }


async def ensure_validating_webhook(kube: Kube, wanted: dict[str, Any]) -> bool:
    """Create or patch the ValidatingWebhookConfiguration to ``wanted``; whether it changed anything.

    Raises KubeError (403: the operator may not read or write it)."""
    name = wanted["metadata"]["name"]
    current = await kube.get(VALIDATING_WEBHOOK, None, name)
    if current is None:
        await kube.create(wanted)
    elif not differs(current, wanted):
        return False
    else:
        await kube.patch_merge(VALIDATING_WEBHOOK, None, name, {"webhooks": wanted["webhooks"]})
    where = wanted["webhooks"][0]["clientConfig"]
    logger.info(
        "Configured validating webhook name=%s clientConfig=%s failurePolicy=%s",
        name,
        where.get("url") or where.get("service"),
        wanted["webhooks"][0]["failurePolicy"],
    )
    return True


def forbidden(exc: KubeError, name: str) -> KubeError:
    """The 403 of :func:`ensure_validating_webhook`, with what to grant."""
    return KubeError(
        403,
        exc.reason,
        f"the operator may not read or write the ValidatingWebhookConfiguration {name} ({exc.message}); "
        "grant get, create and patch on validatingwebhookconfigurations (the chart does), or pass "
        "--validating-webhook '' to leave it unregistered",
    )
