"""Settings of the worker runtime, and the worker's names for the shared settings mechanism.

Precedence: a command-line flag beats the environment variable, which beats the field default. Every
field carries its help text; ``--help`` prints it with the env var it reads. This is the only module of
``dynamo_worker.runtime`` that reads the environment. How a settings model becomes flags and reads its
environment variables (``add_model_arguments``, ``settings_from_args``, on pydantic-settings) is
``dynamo_api.settings_sources``, shared with the operator; a field names its env var itself::

    namespace: str = Field("dynamo", description="...", json_schema_extra={"env": ENV_NAMESPACE})
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import orjson
from dynamo_api import contract
from dynamo_api.settings_sources import (
    Settings,
    SettingsError,
    add_model_arguments,
    settings_from_args,
)
from pydantic import Field

__all__ = [
    "RuntimeSettings",
    "SettingsError",
    "add_model_arguments",
    "configure_logging",
    "new_instance_id",
    "redact_url",
    "settings_from_args",
]


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """The project's cache folder (tiny model, SGLang source for the compatibility check, binaries):
    ``$DYNAMO_CACHE``, else ``$XDG_CACHE_HOME/dynamo-sglang``, else ``~/.cache/dynamo-sglang``; the same
    rule as ``hack/*.sh``."""
    env = os.environ if env is None else env
    if env.get("DYNAMO_CACHE"):
        return Path(env["DYNAMO_CACHE"])
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dynamo-sglang"


def redact_url(url: str) -> str:
    """``url`` with its password or token replaced by ``***`` (``nats://user:***@host:4222``), for
    logs and error messages: credentials in a URL are secrets too."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    userinfo, _, host = rest.partition("@")
    user = userinfo.split(":", 1)[0] if ":" in userinfo else ""
    return f"{scheme}://{user + ':' if user else ''}***@{host}"


def new_instance_id() -> str:
    """A fresh 16-hex-digit instance id (random, so a restarted process is a new instance)."""
    return secrets.token_hex(8)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(body).decode()


def configure_logging(env: Mapping[str, str] | None = None) -> None:
    """Log to stderr at ``DYN_LOG_LEVEL`` (default INFO), as text or JSON (``DYN_LOG_FORMAT``)."""
    env = os.environ if env is None else env
    level = env.get(contract.ENV_LOG_LEVEL, "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    if env.get(contract.ENV_LOG_FORMAT, "text").lower() == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level, logging.INFO), handlers=[handler], force=True)


class RuntimeSettings(Settings):
    """What every worker process needs to join a graph: where NATS is, who it is, where it listens."""

    namespace: str = Field(
        "dynamo",
        description="Dynamo namespace that scopes discovery and events (<k8s-namespace>-<graph> in pods).",
        pattern=r"^[A-Za-z0-9_-]+$",
        json_schema_extra={"env": contract.ENV_NAMESPACE},
    )
    component: str = Field(
        "backend",
        description="Component (service) name this worker registers under, e.g. 'decode'.",
        pattern=r"^[A-Za-z0-9_-]+$",
        json_schema_extra={"env": contract.ENV_COMPONENT},
    )
    endpoint: str = Field(
        contract.DEFAULT_ENDPOINT,
        description="Request-plane endpoint name this worker serves.",
        pattern=r"^[A-Za-z0-9_-]+$",
        json_schema_extra={"env": contract.ENV_ENDPOINT},
    )
    nats_server: str = Field(
        f"nats://127.0.0.1:{contract.NATS_PORT}",
        description="NATS URL (JetStream enabled) for discovery, model cards and events.",
        json_schema_extra={"env": contract.ENV_NATS_SERVER},
    )
    system_port: int = Field(
        contract.SYSTEM_PORT,
        ge=0,
        le=65535,
        description="Port of the system server (/live, /health, /metrics); 0 picks a free port.",
        json_schema_extra={"env": contract.ENV_SYSTEM_PORT},
    )
    system_enabled: bool = Field(
        True,
        description="Serve /live, /health and /metrics on --system-port.",
        json_schema_extra={"env": contract.ENV_SYSTEM_ENABLED},
    )
    request_port: int = Field(
        contract.REQUEST_PORT,
        ge=0,
        le=65535,
        description="Port of the request-plane listener; 0 picks a free port.",
        json_schema_extra={"env": contract.ENV_REQUEST_PORT},
    )
    listen_host: str = Field(
        "0.0.0.0",
        description="Interface the request-plane and system servers bind to (127.0.0.1 for local-only).",
        json_schema_extra={"env": contract.ENV_LISTEN_HOST},
    )
    advertise_host: str = Field(
        "127.0.0.1",
        description="Host peers use to reach this process (the pod IP in Kubernetes).",
        json_schema_extra={"env": contract.ENV_ADVERTISE_HOST, "env_fallbacks": [contract.ENV_POD_IP]},
    )
    discovery_ttl: float = Field(
        contract.DEFAULT_DISCOVERY_TTL_S,
        ge=1.0,
        le=3600.0,
        description="Seconds a registration outlives its last heartbeat (heartbeats run at TTL/3).",
        json_schema_extra={"env": contract.ENV_DISCOVERY_TTL},
    )
    graceful_shutdown_s: float = Field(
        20.0,
        ge=0.0,
        le=3600.0,
        description="On SIGTERM, seconds in-flight requests get to finish before they are aborted.",
        json_schema_extra={"env": contract.ENV_GRACEFUL_SHUTDOWN_S},
    )
    max_inflight: int = Field(
        1024,
        ge=1,
        description="Requests served at once; more are rejected with 'overloaded' (HTTP 503).",
        json_schema_extra={"env": contract.ENV_MAX_INFLIGHT},
    )
    health_check_interval_s: float = Field(
        5.0,
        gt=0,
        le=3600.0,
        description="How often the worker runs its engine's health check (the canary) itself; on a "
        "failure it deregisters (no new traffic), and registers again when the check passes.",
    )
    liveness_fail_after_s: float = Field(
        60.0,
        gt=0,
        le=86400.0,
        description="Seconds the health check may keep failing before /live answers 503, so that "
        "Kubernetes restarts the container.",
    )
    on_engine_death: Literal["restart", "exit"] = Field(
        "restart",
        description="When the engine dies under the worker (a scheduler or detokenizer process exits: OOM "
        "kill, CUDA error, a lost NCCL rank), after its in-flight requests were handed back to the frontend "
        "(which continues them on other workers) and it deregistered: restart the engine in this process, or "
        "exit so that Kubernetes restarts the container. A multinode leader always exits (its group "
        "restarts together). See docs/faults.md.",
    )
    engine_restart_limit: int = Field(
        3,
        ge=0,
        le=1000,
        description="In-place engine restarts allowed within --engine-restart-window-s; one more death "
        "is a crash loop and the worker exits instead (0: never restart in place).",
    )
    engine_restart_window_s: float = Field(
        600.0,
        gt=0,
        le=86400.0,
        description="The window over which --engine-restart-limit counts engine deaths.",
    )
    leader_system_addr: str | None = Field(
        None,
        description="A non-leader rank of a multinode group: host:port of the leader's system server, "
        "to which this rank holds a lifeline so that the leader notices at once when it is gone.",
        json_schema_extra={"env": contract.ENV_LEADER_SYSTEM_ADDR},
    )
    pair_revision: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9._-]{1,64}$",
        description="Revision published in discovery (what fixes the KV layout and the model): the "
        "frontend pairs a prefill and a decode worker only when theirs are equal. The operator sets it on "
        "prefill and decode pods; unset, the worker derives one from its model, model card and page size.",
        json_schema_extra={"env": contract.ENV_REVISION},
    )
    instance_id: str = Field(
        default_factory=new_instance_id,
        pattern=r"^[0-9a-f]{16}$",
        description="Instance id in discovery (16 hex digits); random per process unless given.",
    )

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        add_model_arguments(parser, cls, "runtime (discovery, request plane, system server)")

    @classmethod
    def from_args(
        cls, args: argparse.Namespace | Mapping[str, Any], env: Mapping[str, str] | None = None, **kw: Any
    ) -> RuntimeSettings:
        return settings_from_args(cls, args, env, **kw)

    @classmethod
    def parse(
        cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
    ) -> RuntimeSettings:
        parser = argparse.ArgumentParser(description=cls.__doc__)
        cls.add_arguments(parser)
        return cls.from_args(parser.parse_args(argv), env)
