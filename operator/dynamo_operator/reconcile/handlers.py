"""Every kopf decorator of the operator, in one place. Handlers only route: they never decide.

- DynamoGraphDeployment watch (including the initial listing at start-up, i.e. resume): queue a visit.
- Watches on our children (Deployments, StatefulSets, LeaderWorkerSets, Services; filtered by our
  managed-by label): queue a visit of the owning graph, so a deleted or edited child is restored and
  status follows the children promptly.
- Watch on our DynamoGraphDeploymentScalingAdapters (same label): queue a visit of the owning graph, so
  ``kubectl scale``, HPA and KEDA reach the service promptly.
- Pod watch (same label): multinode group restarts (StatefulSet backend), and a visit of the namespace's
  DynamoModels when a pod starts or stops serving.
- DynamoModel watch: queue a visit of the model (``memo.models``); graphs changing their spec queue the
  visits of their namespace's models too.

Only ``on.event`` handlers are used: they keep no progress in the objects (no kopf annotations, no kopf
finalizers), so deleting a graph never waits for the operator. (A LoRA DynamoModel carries a finalizer
of ours, so that its adapter is unloaded: ``reconcile.model_controller``.) The visits themselves are
:meth:`dynamo_operator.reconcile.controller.Controller.reconcile` and
:meth:`dynamo_operator.reconcile.model_controller.ModelController.reconcile`; ``memo.controller`` and
``memo.models`` are set by ``dynamo_operator.__main__``.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from dynamo_api import dynamo_model, scaling
from dynamo_api.models import GROUP, PLURAL, STORAGE_VERSION

from dynamo_operator.reconcile.controller import Controller
from dynamo_operator.reconcile.kube import LWS
from dynamo_operator.render import labels

logger = logging.getLogger(__name__)

OURS = {labels.MANAGED_BY: labels.MANAGED_BY_VALUE}
_LWS_GROUP = LWS.api_version.split("/")[0]


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.enabled = False  # we post our own Events, on transitions only
    settings.networking.request_timeout = 60
    settings.watching.client_timeout = 600
    settings.watching.server_timeout = 300
    memo.controller.loop.start()
    memo.models.start()
    logger.info(
        "Started reconcile workers count=%d group_backend=%s",
        memo.controller.workers,
        memo.controller.config.group_backend,
    )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.controller.loop.stop()
    await memo.models.stop()
    # The webhook server closes its connections here, while kopf stops: kopf gives every task still
    # running after its own 5 s before it exits, and the API server keeps its connections to the
    # webhook open, so an operator that closed them later exited 5 s after SIGTERM.
    if memo.get("webhook") is not None:
        await memo.webhook.stop()


@kopf.on.login()
async def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf's watches use the operator's credentials (one loader for both clients)."""
    creds = memo.credentials
    scheme, token = await creds.authorization()
    return kopf.ConnectionInfo(
        server=creds.server,
        ca_path=creds.ca_path,
        insecure=not creds.verify_ssl,
        token=token,
        scheme=scheme,
        certificate_path=creds.cert_path,
        private_key_path=creds.key_path,
    )


@kopf.on.probe(id="reconcile_queue")
def reconcile_queue(memo: kopf.Memo, **_: Any) -> int:
    """Reported by GET /healthz: graphs waiting for or in a visit."""
    controller: Controller = memo.controller
    return controller.loop.queue.pending()


@kopf.on.event(GROUP, STORAGE_VERSION, PLURAL)  # v1beta1: the operator never depends on its own webhook
async def graph_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.controller.graph_event(type, body)
    memo.models.graph_event(type, body)


@kopf.on.event("apps", "v1", "deployments", labels=OURS)
@kopf.on.event("apps", "v1", "statefulsets", labels=OURS)
@kopf.on.event("v1", "services", labels=OURS)
@kopf.on.event(_LWS_GROUP, "v1", "leaderworkersets", labels=OURS)
@kopf.on.event(GROUP, scaling.VERSION, scaling.PLURAL, labels=OURS)
async def child_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.controller.child_event(body)


@kopf.on.event("v1", "pods", labels=OURS)
async def pod_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await memo.controller.pod_event(type, body)
    memo.models.pod_event(type, body)


@kopf.on.event(GROUP, dynamo_model.VERSION, dynamo_model.PLURAL)
async def model_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.models.model_event(type, body)
