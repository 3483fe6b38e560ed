"""``python -m dynamo_operator`` / ``dynamo-operator``: run the operator (kopf, in-process).

Start-up: read settings (flags and ``DYN_OPERATOR_*``), connect to the API server, resolve the
multinode group backend (``auto``: LeaderWorkerSet when its CRD is installed) and the gang scheduler
(``auto``: coscheduling when scheduler-plugins' PodGroup CRD is installed), serve the conversion and
validating webhooks and register both (:mod:`dynamo_operator.webhook`,
:mod:`dynamo_operator.validating_webhook`), then run kopf scoped to the given namespaces (or the whole
cluster), standalone unless ``--peering`` is given, with the liveness endpoint ``GET /healthz``.
SIGTERM/SIGINT stop it gracefully.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Literal

import aiohttp
import kopf

from dynamo_operator import certs, validating_webhook, webhook
from dynamo_operator.certs import CertError
from dynamo_operator.config import OperatorConfig
from dynamo_operator.reconcile import handlers  # noqa: F401  (importing registers the kopf handlers)
from dynamo_operator.reconcile.controller import Controller
from dynamo_operator.reconcile.kube import (
    FIELD_MANAGER,
    LWS_CRD_NAME,
    POD_GROUP_CRD_NAME,
    Credentials,
    Kube,
    KubeError,
    load_credentials,
    resource_type,
)
from dynamo_operator.reconcile.model_controller import ModelController
from dynamo_operator.settings import OperatorSettings, SettingsError, parse_settings
from dynamo_operator.webhook import WebhookServer

logger = logging.getLogger("dynamo_operator")

__all__ = ["main", "resolve_gang_scheduler", "resolve_group_backend"]


async def resolve_group_backend(kube: Kube, wanted: str) -> Literal["lws", "statefulset"]:
    """``auto`` becomes ``lws`` when the LeaderWorkerSet CRD is installed and established."""
    if wanted == "lws":
        return "lws"
    if wanted == "statefulset":
        return "statefulset"
    installed = await kube.crd_established(LWS_CRD_NAME)
    logger.info(
        "Detected group backend=%s (CRD %s %s)",
        "lws" if installed else "statefulset",
        LWS_CRD_NAME,
        "is installed" if installed else "is not installed",
    )
    return "lws" if installed else "statefulset"


def _configure_logging(settings: OperatorSettings) -> None:
    fmt = kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.FULL
    kopf.configure(debug=settings.log_level == "DEBUG", log_format=fmt)
    logging.getLogger().setLevel(settings.log_level)
    # kopf reports every handled watch event at INFO; ours say what changed in the world instead.
    logging.getLogger("kopf.objects").setLevel(max(logging.WARNING, logging.getLevelName(settings.log_level)))


async def resolve_gang_scheduler(kube: Kube, wanted: str) -> Literal["coscheduling", "none"]:
    """``auto`` becomes ``coscheduling`` when scheduler-plugins' PodGroup CRD is installed and established."""
    if wanted in ("coscheduling", "none"):
        return "coscheduling" if wanted == "coscheduling" else "none"
    installed = await kube.crd_established(POD_GROUP_CRD_NAME)
    logger.info(
        "Detected gang scheduler=%s (CRD %s %s)",
        "coscheduling" if installed else "none",
        POD_GROUP_CRD_NAME,
        "is installed" if installed else "is not installed",
    )
    return "coscheduling" if installed else "none"


async def resolve_config(kube: Kube, settings: OperatorSettings) -> OperatorConfig:
    backend = await resolve_group_backend(kube, settings.group_backend)
    gang = await resolve_gang_scheduler(kube, settings.gang_scheduler)
    return settings.operator_config(backend, gang)


async def start_webhook(
    kube: Kube, settings: OperatorSettings, config: OperatorConfig, scratch: Path
) -> tuple[WebhookServer, asyncio.Task[None] | None]:
    """Serve the conversion and validating webhooks, point the CRD at the first and register the second
    (raises CertError, OSError, KubeError)."""
    cert = certs.load_or_generate(settings.webhook_cert_dir, settings.webhook_hosts(), scratch)
    server = WebhookServer(
        cert,
        settings.webhook_host,
        settings.webhook_port,
        validate=lambda body: validating_webhook.admission_review(
            body, lambda obj: validating_webhook.judge(obj, config)
        ),
        validate_path=validating_webhook.PATH,
    )
    await server.start()
    checks: list[tuple[str, Callable[[], Awaitable[bool]]]] = []
    if settings.webhook_configure_crd:
        patch = webhook.crd_conversion_patch(settings.webhook_client_config(), cert.ca_pem)
        checks.append(
            (
                f"conversion webhook of crd={webhook.CRD_NAME}",
                partial(webhook.ensure_crd_conversion, kube, patch),
            )
        )
    if settings.validating_webhook:
        wanted = validating_webhook.validating_webhook_configuration(
            settings.validating_webhook,
            settings.webhook_client_config(validating_webhook.PATH),
            cert.ca_pem,
            settings.webhook_failure_policy,
            () if settings.all_namespaces else settings.namespace,
        )
        checks.append(
            (
                f"validating webhook {settings.validating_webhook}",
                partial(validating_webhook.ensure_validating_webhook, kube, wanted),
            )
        )
    for what, check in checks:
        try:
            await check()
        except KubeError as exc:
            await server.stop()
            if exc.status == 403 and what.startswith("conversion"):
                raise KubeError(
                    403,
                    exc.reason,
                    f"the operator may not patch the CRD {webhook.CRD_NAME} to configure its conversion "
                    f"webhook ({exc.message}); grant get and patch on that CRD (the chart does) or pass "
                    "--no-webhook-configure-crd and set spec.conversion yourself",
                ) from None
            if exc.status == 403:
                raise validating_webhook.forbidden(exc, settings.validating_webhook or "") from None
            raise
    if not checks:
        return server, None
    return server, asyncio.create_task(webhook.keep_registered(checks))


async def run(settings: OperatorSettings, creds: Credentials) -> None:
    async with Kube(creds, field_manager=FIELD_MANAGER, resource_type=resource_type) as kube:
        config = await resolve_config(kube, settings)
        server: WebhookServer | None = None
        keeper: asyncio.Task[None] | None = None
        with tempfile.TemporaryDirectory(prefix="dynamo-operator-webhook-") as scratch:
            if settings.webhook_port:
                server, keeper = await start_webhook(kube, settings, config, Path(scratch))
            try:
                await _run_kopf(settings, creds, kube, config, server)
            finally:
                if keeper is not None:
                    keeper.cancel()
                if server is not None:
                    await server.stop()


async def _run_kopf(
    settings: OperatorSettings,
    creds: Credentials,
    kube: Kube,
    config: OperatorConfig,
    webhook_server: WebhookServer | None,
) -> None:
    controller = Controller(
        kube=kube,
        config=config,
        workers=settings.workers,
        resync_interval_s=settings.resync_interval_s,
        not_ready_recheck_s=settings.not_ready_recheck_s,
    )
    scope = "all namespaces" if settings.all_namespaces else "namespaces " + ",".join(settings.namespace)
    logger.info("Starting operator scope=%s server=%s", scope, creds.server)
    await kopf.operator(
        clusterwide=settings.all_namespaces,
        namespaces=list(settings.namespace),
        standalone=settings.peering is None,
        peering_name=settings.peering,
        liveness_endpoint=settings.liveness_endpoint,
        memo=kopf.Memo(
            controller=controller,
            models=ModelController(kube=kube, resync_interval_s=settings.resync_interval_s),
            credentials=creds,
            webhook=webhook_server,
        ),
    )


async def _main(settings: OperatorSettings) -> int:
    try:
        creds = await load_credentials(settings.kubeconfig, settings.use_in_cluster())
    except Exception as exc:  # the kubeconfig loader raises several unrelated types
        print(
            f"dynamo-operator: cannot load Kubernetes credentials ({exc}); pass --kubeconfig PATH, set "
            "KUBECONFIG, or run in a pod with a service account",
            file=sys.stderr,
        )
        return 2
    try:
        await run(settings, creds)
    except CertError as exc:
        print(f"dynamo-operator: {exc}", file=sys.stderr)
        return 2
    except (aiohttp.ClientError, KubeError, OSError) as exc:
        print(
            f"dynamo-operator: cannot use the Kubernetes API at {creds.server} ({exc}); check the kubeconfig "
            "and that the operator's account may read customresourcedefinitions",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse_settings(argv)
    except SettingsError as exc:
        print(f"dynamo-operator: {exc}", file=sys.stderr)
        return 2
    _configure_logging(settings)
    return asyncio.run(_main(settings))


if __name__ == "__main__":
    sys.exit(main())
