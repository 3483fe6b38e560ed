"""Settings of the endpoint picker: every knob as a typed field with help, its flag and env var.

Precedence: flag > environment variable > default (``runtime.settings.settings_from_args``). This is the
only module of ``dynamo_worker.epp`` that reads the environment.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from dynamo_api import contract
from dynamo_api.frontend_args import DEFAULT_PICKER_ROUTER_MODE, PickerRouterMode
from dynamo_api.settings_sources import Settings
from pydantic import Field, PrivateAttr, model_validator

from dynamo_worker.router.policy import KvWeights
from dynamo_worker.router.router import DEFAULT_PREDICT_TTL_S
from dynamo_worker.runtime.settings import add_model_arguments, settings_from_args

__all__ = ["EppSettings"]

_KV = KvWeights()


class EppSettings(Settings):
    """Gateway API Inference Extension endpoint picker: Envoy ext_proc, deciding with our router."""

    host: str = Field("0.0.0.0", description="Interface the gRPC and metrics servers bind to.")
    grpc_port: int = Field(
        contract.EPP_PORT, ge=0, le=65535, description="Port of ext_proc and gRPC health; 0 picks a free one."
    )
    metrics_port: int = Field(
        contract.SYSTEM_PORT, ge=0, le=65535, description="Port of /metrics and /health; 0 picks a free one."
    )
    frontends: str = Field(
        ...,
        min_length=1,
        description="The frontend replicas Envoy may send a request to, comma-separated host:port "
        "(each runs --router-mode direct). A host name is resolved to all its addresses (a headless "
        "Service names every pod) and again every --frontend-resolve-s.",
        json_schema_extra={"env": contract.ENV_EPP_FRONTENDS},
    )
    frontend_resolve_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="How often the host names in --frontends are resolved again (every second while "
        "none has resolved yet).",
    )
    namespace: str = Field(
        "dynamo",
        pattern=r"^[A-Za-z0-9_-]+$",
        description="Dynamo namespace whose workers the frontends serve.",
        json_schema_extra={"env": contract.ENV_NAMESPACE},
    )
    nats_server: str = Field(
        f"nats://127.0.0.1:{contract.NATS_PORT}",
        description="NATS URL (JetStream): discovery, model cards, KV events and load metrics.",
        json_schema_extra={"env": contract.ENV_NATS_SERVER},
    )
    router_mode: PickerRouterMode = Field(
        DEFAULT_PICKER_ROUTER_MODE,
        description="How the workers are picked (the frontend's router, one decision for all replicas).",
    )
    kv_overlap_weight: float = Field(
        _KV.overlap_weight, ge=0.0, le=1000.0, description="Weight of the prefill cost in the kv cost."
    )
    kv_predict_ttl_s: float = Field(
        DEFAULT_PREDICT_TTL_S,
        ge=0,
        le=3600,
        description="How long a routed prompt's blocks count as cached before its KV events arrive.",
    )
    kv_snapshot_timeout_s: float = Field(
        5.0, gt=0, le=600, description="Bound on a worker's answer to the KV snapshot asked when it joins."
    )
    model_load_timeout_s: float = Field(
        120.0, gt=0, le=3600, description="Bound on loading a model's card (tokenizer, chat template)."
    )
    queue_depth_threshold: int = Field(
        5,
        ge=0,
        description="A worker with this many requests waiting (its load reports) is saturated; while all of "
        "a model's workers are, its requests wait in the picker's queue.",
    )
    kv_cache_util_threshold: float = Field(
        0.8, gt=0, le=1.0, description="A worker with this share of its KV cache in use is saturated too."
    )
    max_queued: int = Field(
        100,
        ge=0,
        description="Requests of one model that may wait; beyond it the answer is 429 (Retry-After).",
    )
    queue_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="How long a request may wait in the queue; past it the answer is 429.",
    )
    objectives: str = Field(
        "",
        description="Priorities of InferenceObjectives, name=priority comma-separated (e.g. "
        "chat=10,batch=-5): a request's x-gateway-inference-objective header picks its priority "
        "(unknown or absent: 0); a waiting request with a higher priority is admitted first.",
    )
    retry_after_s: int = Field(1, ge=1, le=3600, description="Retry-After of a 429 or a 503.")
    max_body_bytes: int = Field(
        32 * 1024 * 1024, ge=1024, description="Largest request body read; a larger one gets 413."
    )

    _priorities: dict[str, int] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _read_objectives(self) -> EppSettings:
        for item in (i.strip() for i in self.objectives.split(",")):
            if not item:
                continue
            name, sep, value = item.partition("=")
            try:
                self._priorities[name.strip()] = int(value)
            except ValueError:
                raise ValueError(
                    f"--objectives item '{item}' is not name=integer (e.g. --objectives chat=10,batch=-5)"
                ) from None
            if not sep or not name.strip():
                raise ValueError(f"--objectives item '{item}' is not name=integer")
        self.frontend_list()  # checked at start
        return self

    def priority(self, objective: str | None) -> int:
        return self._priorities.get(objective or "", 0)

    def frontend_list(self) -> list[tuple[str, int]]:
        """(host, port) of each --frontends item."""
        out = []
        for item in (i.strip() for i in self.frontends.split(",")):
            if not item:
                continue
            host, _, port = item.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"--frontends item '{item}' is not host:port (e.g. frontend:8000)")
            out.append((host.strip("[]"), int(port)))
        if not out:
            raise ValueError("--frontends names no frontend: give host:port of the frontend replicas")
        return out

    @classmethod
    def parser(cls) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            prog="python -m dynamo_worker.epp",
            description=(
                "Endpoint picker of the Gateway API Inference Extension: an Envoy ext_proc server "
                "(full-duplex streamed body). Per request it reads the OpenAI body (chat, completions, "
                "embeddings), tokenizes with the model's card, picks the worker(s) with the frontend's "
                "router (KV overlap, load, LoRA residency, the prefill/decode pair as one decision), and "
                "tells Envoy the frontend replica to send it to (x-gateway-destination-endpoint) and the "
                "workers it must serve it on (x-dynamo-worker-instance-id, x-dynamo-prefill-instance-id). "
                "Serves gRPC health on --grpc-port and /metrics on --metrics-port. See docs/gateway-api.md."
            ),
        )
        add_model_arguments(parser, cls, "endpoint picker")
        return parser

    @classmethod
    def parse(cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> EppSettings:
        args = cls.parser().parse_args(argv)
        return settings_from_args(cls, args, env)
