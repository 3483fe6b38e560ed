"""Operator settings: one typed model, read from environment variables and command-line flags.

This is the only module of ``dynamo_operator`` that reads the environment. Every field is both a flag
(``--field-name``) and an environment variable (``DYN_OPERATOR_FIELD_NAME``); a flag wins over the
environment, which wins over the default. ``--help`` lists them all with their help text. The
mechanism (pydantic-settings' CLI source and a source for each field's variable) is the worker's too:
``dynamo_api.settings_sources``.

The fields that shape pods (images, NATS address, RDMA resource, ...) are inherited from
:class:`dynamo_operator.config.OperatorConfig`, declared once; :meth:`OperatorSettings.operator_config`
builds the render input once the group backend is known.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from dynamo_api import contract
from dynamo_api.settings_sources import (
    Settings,
    SettingsError,
    add_model_arguments,
    settings_from_args,
)
from pydantic import Field, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import SettingsConfigDict

from dynamo_operator.config import DEFAULT_TOPOLOGY_DOMAINS, OperatorConfig

__all__ = ["ENV_PREFIX", "OperatorSettings", "SettingsError", "parse_settings"]

ENV_PREFIX = "DYN_OPERATOR_"
# Set by Kubernetes in every pod: the operator then uses its service account unless told otherwise.
_IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"


class OperatorSettings(Settings, OperatorConfig):
    """How the operator connects, what it watches, and the defaults it renders pods with (the fields
    inherited from OperatorConfig)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)  # every field reads DYN_OPERATOR_<FIELD>

    # --- connection and scope ---------------------------------------------------------------------
    kubeconfig: Path | None = Field(
        None,
        description="kubeconfig file to use. Default: the in-cluster service account when running in a "
        "pod, else $KUBECONFIG, else ~/.kube/config.",
    )
    in_cluster: bool | None = Field(
        None,
        description="Use the pod's service account (true) or a kubeconfig (false). Default: auto "
        f"(in-cluster when ${_IN_CLUSTER_ENV} is set and no --kubeconfig is given).",
    )
    namespace: tuple[str, ...] = Field(
        (),
        description="Watch only this namespace (repeatable; the environment variable takes a comma-"
        "separated list). Exactly one of --namespace and --all-namespaces is required.",
    )
    all_namespaces: bool = Field(False, description="Watch DynamoGraphDeployments in every namespace.")
    peering: str | None = Field(
        None,
        description="kopf peering object name, for several operator replicas with one active. Default: "
        "standalone (no peering; run one replica).",
    )

    # --- behaviour ----------------------------------------------------------------------------------
    group_backend: Literal["auto", "lws", "statefulset"] = Field(  # type: ignore[assignment]  # auto: resolved
        "auto",
        description="What multinode groups are made of. auto: LeaderWorkerSet when the CRD "
        "leaderworkersets.leaderworkerset.x-k8s.io is installed at start-up, else StatefulSets.",
    )
    gang_scheduler: Literal["auto", "coscheduling", "none"] = Field(  # type: ignore[assignment]  # auto: resolved
        "auto",
        description="Who starts gangs (services with minAvailable, multinode groups) whole or not at all. "
        "auto: coscheduling when scheduler-plugins' CRD podgroups.scheduling.x-k8s.io is installed at "
        "start-up (its scheduler must run as --gang-scheduler-name), else none.",
    )
    workers: int = Field(8, ge=1, le=256, description="Graphs reconciled concurrently.")
    resync_interval_s: float = Field(
        300.0,
        gt=0,
        description="Every graph and DynamoModel is reconciled at least this often (drift watches missed).",
    )
    not_ready_recheck_s: float = Field(
        20.0, gt=0, description="A graph that is not Ready yet is re-checked at least this often."
    )
    liveness_host: str = Field("0.0.0.0", description="Address of the liveness endpoint.")
    liveness_port: int = Field(
        contract.OPERATOR_LIVENESS_PORT,
        ge=0,
        le=65535,
        description="Port of the liveness endpoint GET /healthz (0 disables it).",
    )
    # --- conversion webhook (v1alpha1 <-> v1beta1) ------------------------------------------------
    webhook_port: int = Field(
        contract.OPERATOR_WEBHOOK_PORT,
        ge=0,
        le=65535,
        description="HTTPS port of the conversion webhook (POST /convert). 0 disables it: requests at "
        "nvidia.com/v1alpha1 then fail unless another operator serves it.",
    )
    webhook_host: str = Field("0.0.0.0", description="Address the conversion webhook listens on.")
    webhook_service: str | None = Field(
        None,
        description="NAMESPACE/NAME[:PORT] of the Service in front of the webhook, written into the CRD "
        "(the chart sets it). Default: a URL, see --webhook-url.",
    )
    webhook_url: str | None = Field(
        None,
        description="URL the API server calls for conversion, written into the CRD, for an operator outside "
        "the cluster; validation is called at the same URL ending in /validate instead of /convert. "
        "Default: https://<webhook-host, or 127.0.0.1>:<webhook-port>/convert.",
    )
    webhook_cert_dir: Path | None = Field(
        None,
        description="Folder with tls.crt, tls.key and ca.crt (a mounted kubernetes.io/tls Secret). "
        "Default: a CA and certificate generated at start-up.",
    )
    webhook_configure_crd: bool = Field(
        True,
        description="Write the webhook's address and CA bundle into the CRD's spec.conversion at start "
        "and keep them there (needs get/patch on that one CRD).",
    )
    validating_webhook: str | None = Field(
        "dynamo-sglang-operator",
        description="Name of the ValidatingWebhookConfiguration the operator keeps pointed at its POST "
        "/validate (created when missing; the chart installs it): graphs that cannot run are refused at "
        "apply. Empty: not registered (the operator still refuses them in status).",
    )
    webhook_failure_policy: Literal["Ignore", "Fail"] = Field(
        "Ignore",
        description="What the API server does with a graph while the operator cannot be reached: Ignore "
        "stores it unvalidated (the operator judges it when back), Fail refuses every create and update.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Operator log level.")
    log_format: Literal["text", "json"] = Field("text", description="Operator log format.")

    @field_validator("topology_domains", mode="before")
    @classmethod
    def _domains(cls, value: Any) -> Any:
        """NAME=LABEL entries (repeatable, comma-separated) or a JSON object, added to the defaults."""
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple):
            return value
        given: dict[str, Any] = {}
        for item in value:
            if not isinstance(item, str):
                return value
            if item.strip().startswith("{"):
                given.update(json.loads(item))
                continue
            for part in filter(None, (p.strip() for p in item.split(","))):
                name, sep, label = part.partition("=")
                if not sep or not name or not label:
                    raise ValueError(f"{part!r} is not NAME=LABEL (e.g. rack=example.com/rack)")
                given[name] = label
        return {**DEFAULT_TOPOLOGY_DOMAINS, **given}

    @field_validator("namespace", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """The environment variable lists namespaces separated by commas."""
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @model_validator(mode="after")
    def _webhook_target(self) -> OperatorSettings:
        if self.webhook_service and self.webhook_url:
            raise ValueError(
                "--webhook-service and --webhook-url both say where the API server reaches the webhook: "
                "pass only one"
            )
        if self.webhook_service and self.webhook_service_ref is None:
            raise ValueError(
                f"--webhook-service {self.webhook_service!r} is not NAMESPACE/NAME[:PORT] "
                "(e.g. dynamo/dynamo-operator-webhook:443)"
            )
        if self.webhook_url and not self.webhook_url.startswith("https://"):
            raise ValueError(f"--webhook-url {self.webhook_url!r} must start with https://")
        return self

    @property
    def webhook_service_ref(self) -> dict[str, Any] | None:
        """The CRD's clientConfig.service for --webhook-service, or None."""
        if not self.webhook_service:
            return None
        where, _, port = self.webhook_service.partition(":")
        namespace, _, name = where.partition("/")
        if not namespace or not name or "/" in name or (port and not port.isdigit()):
            return None
        return {"namespace": namespace, "name": name, "path": "/convert", "port": int(port or 443)}

    def webhook_client_config(self, path: str = "/convert") -> dict[str, Any]:
        """Where the API server calls the webhook at ``path`` (/convert, or /validate on the same server):
        ``{"service": ...}`` or ``{"url": ...}``."""
        service = self.webhook_service_ref
        if service is not None:
            return {"service": {**service, "path": path}}
        if self.webhook_url:  # the URL of /convert; the validating webhook's ends in /validate instead
            base = self.webhook_url.rstrip("/").removesuffix("/convert")
            return {"url": self.webhook_url if path == "/convert" else base + path}
        host = "127.0.0.1" if self.webhook_host in ("0.0.0.0", "::", "") else self.webhook_host
        host = f"[{host}]" if ":" in host else host
        return {"url": f"https://{host}:{self.webhook_port}{path}"}

    def webhook_hosts(self) -> list[str]:
        """Names the serving certificate is made for (generated certificates)."""
        service = self.webhook_service_ref
        if service is not None:
            ns, name = service["namespace"], service["name"]
            return [f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local", f"{name}.{ns}", name]
        host = urlsplit(self.webhook_client_config()["url"]).hostname or "127.0.0.1"
        return [host] if host in ("127.0.0.1", "localhost") else [host, "127.0.0.1"]

    @model_validator(mode="after")
    def _one_scope(self) -> OperatorSettings:
        if bool(self.namespace) == self.all_namespaces:
            raise ValueError(
                "choose the scope: pass --namespace NAME (repeatable) to watch namespaces, or "
                "--all-namespaces to watch the whole cluster (not both)"
            )
        return self

    def use_in_cluster(self, environ: Mapping[str, str] | None = None) -> bool:
        if self.in_cluster is not None:
            return self.in_cluster
        environ = os.environ if environ is None else environ
        return self.kubeconfig is None and bool(environ.get(_IN_CLUSTER_ENV))

    def operator_config(
        self,
        group_backend: Literal["lws", "statefulset"],
        gang_scheduler: Literal["coscheduling", "none"] = "none",
    ) -> OperatorConfig:
        """The render input, with the group backend and gang scheduler resolved (auto detection happens
        at start-up)."""
        fields = OperatorConfig.model_fields.keys() - {"group_backend", "gang_scheduler"}
        return OperatorConfig(
            **self.model_dump(include=fields), group_backend=group_backend, gang_scheduler=gang_scheduler
        )

    @property
    def liveness_endpoint(self) -> str | None:
        if self.liveness_port == 0:
            return None
        return f"http://{self.liveness_host}:{self.liveness_port}/healthz"


# --- the CLI and environment, derived from the fields ---------------------------------------------------


def _help(name: str, info: FieldInfo, envs: list[str]) -> str:
    default = info.default
    return f"{info.description} [env {envs[0]}; default: {default if default != () else 'none'}]"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dynamo-operator",
        description="Kubernetes operator for DynamoGraphDeployment (nvidia.com/v1beta1 and v1alpha1, "
        "converted by its webhook): renders each graph into Deployments, StatefulSets/LeaderWorkerSets "
        "and Services, keeps them converged, and reports status and Events. Every flag can also be set "
        f"by the environment variable named in its help ({ENV_PREFIX}<FLAG>); flags win.",
    )
    sections: dict[type, str] = {
        OperatorSettings: "the operator process",
        OperatorConfig: "what the pods it renders get (unless a graph says otherwise)",
    }
    add_model_arguments(parser, OperatorSettings, None, help_text=_help, switches="dual", sections=sections)
    return parser


def parse_settings(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> OperatorSettings:
    """Settings from ``environ`` (default os.environ) overridden by ``argv`` (default sys.argv[1:]).

    Raises SettingsError naming the offending flag/variable; ``--help`` exits after printing help."""
    return settings_from_args(OperatorSettings, build_parser().parse_args(argv), environ)
