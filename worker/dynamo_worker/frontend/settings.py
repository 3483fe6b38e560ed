"""Settings of the OpenAI frontend: every knob as a typed field with help, its flag and env var.

Precedence: flag > environment variable > default (``runtime.settings.settings_from_args``). This is the
only module of ``dynamo_worker.frontend`` that reads the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from dynamo_api import contract
from dynamo_api.frontend_args import DEFAULT_ROUTER_MODE, RouterMode
from dynamo_api.settings_sources import Settings
from pydantic import Field, PrivateAttr, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from dynamo_worker.router.policy import KvWeights
from dynamo_worker.router.router import DEFAULT_PREDICT_TTL_S
from dynamo_worker.runtime.request_plane import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_FIRST_TOKEN_TIMEOUT_S,
    DEFAULT_INTER_TOKEN_TIMEOUT_S,
)
from dynamo_worker.runtime.settings import add_model_arguments, settings_from_args

__all__ = ["FrontendSettings"]

_KV = KvWeights()  # the kv policy's knobs have their defaults in router/policy.py


class FrontendSettings(Settings):
    """OpenAI-compatible HTTP frontend: finds workers in discovery (NATS), tokenizes, routes, streams."""

    # --kv-overlap-weight also answers to NVIDIA Dynamo's names for it (older, newer).
    model_config = SettingsConfigDict(
        cli_shortcuts={"kv-overlap-weight": ["kv-overlap-score-weight", "router-kv-overlap-score-weight"]}
    )

    http_host: str = Field(
        "0.0.0.0",
        description="Interface the HTTP server binds to (127.0.0.1 for local-only).",
        json_schema_extra={"env": contract.ENV_HTTP_HOST},
    )
    http_port: int = Field(
        contract.FRONTEND_PORT,
        ge=0,
        le=65535,
        description="Port of the OpenAI API, /health, /live and /metrics; 0 picks a free port.",
        json_schema_extra={"env": contract.ENV_HTTP_PORT},
    )
    http_workers: int = Field(
        1,
        ge=1,
        le=64,
        description="Serving processes sharing the HTTP port (SO_REUSEPORT): each has its own event loop, "
        "discovery watch and router state, and the kernel spreads connections over them. More than one "
        "uses more cores for streaming; /metrics then shows the process that answers the scrape.",
    )
    http_reuse_port: bool = Field(
        False,
        description="Bind the HTTP port with SO_REUSEPORT, so that other frontends can share it (set for "
        "the extra processes of --http-workers).",
    )
    namespace: str = Field(
        "dynamo",
        pattern=r"^[A-Za-z0-9_-]+$",
        description="Dynamo namespace whose workers this frontend serves (<k8s-namespace>-<graph> in pods).",
        json_schema_extra={"env": contract.ENV_NAMESPACE},
    )
    nats_server: str = Field(
        f"nats://127.0.0.1:{contract.NATS_PORT}",
        description="NATS URL (JetStream) for discovery, model cards, KV events and load metrics.",
        json_schema_extra={"env": contract.ENV_NATS_SERVER},
    )
    router_mode: RouterMode = Field(
        DEFAULT_ROUTER_MODE,
        description="How a worker is picked: round-robin, random, kv (prefix-cache overlap + load), or "
        "direct: the worker(s) a gateway's endpoint picker (python -m dynamo_worker.epp) named in the "
        "x-dynamo-worker-instance-id / x-dynamo-prefill-instance-id headers, round-robin when they cannot "
        "serve (docs/gateway-api.md).",
        json_schema_extra={"env": contract.ENV_ROUTER_MODE},
    )
    kv_overlap_weight: float = Field(
        _KV.overlap_weight,
        ge=0.0,
        le=1000.0,
        description="kv router: cost of one prompt block the chosen worker would have to prefill (not in "
        "its cache) relative to one block of prefill already queued there; 0 routes on load alone. The "
        "cost model and its defaults are documented in dynamo_worker/router/policy.py.",
        json_schema_extra={"env": contract.ENV_KV_OVERLAP_WEIGHT},
    )
    kv_decode_weight: float = Field(
        _KV.decode_weight,
        ge=0.0,
        le=1000.0,
        description="kv router: cost of one KV block held by a running sequence relative to one block "
        "of prefill (cost = overlap weight x new blocks + queued prefill blocks + this x running blocks).",
    )
    kv_balance_abs_threshold: int = Field(
        _KV.balance_abs_threshold,
        ge=0,
        description="kv router balance guard: when the cheapest worker runs more than this many requests "
        "more than the idlest (or more than 2 x sqrt(mean requests a worker), the natural swing at "
        "that load, if larger) ...",
    )
    kv_balance_rel_threshold: float = Field(
        _KV.balance_rel_threshold,
        ge=1.0,
        description="... and more than this many times as many, the request goes to the idlest worker "
        "with room for its new blocks (into a full cache only past 4x the absolute threshold).",
    )
    kv_host_hit_weight: float = Field(
        _KV.host_hit_weight,
        ge=0.0,
        le=1.0,
        description="kv router: share of a block's prefill saved when a worker holds it in host memory "
        "(SGLang's HiCache, --enable-hierarchical-cache) rather than on its GPU, where a GPU block saves 1; "
        "0 routes on GPU-held blocks alone. Default: what tests/gpu/run_hicache.py measured on an H200 "
        "(NVIDIA Dynamo uses 0.75, llm-d 0.8); see docs/kv-tiers.md.",
    )
    kv_disk_hit_weight: float = Field(
        _KV.disk_hit_weight,
        ge=0.0,
        le=1.0,
        description="kv router: the same for a block held only in HiCache's storage tier "
        "(--hicache-storage-backend). Default: NVIDIA Dynamo's 0.25.",
    )
    kv_lora_swap_blocks: float = Field(
        _KV.lora_swap_blocks,
        ge=0.0,
        le=1000.0,
        description="kv router: cost, in blocks of prefill, of sending a LoRA adapter's request to a worker "
        "whose GPU slots do not hold the adapter now (it must copy it in).",
    )
    kv_lora_wait_blocks: float = Field(
        _KV.lora_wait_blocks,
        ge=0.0,
        le=1000.0,
        description="kv router: cost, in blocks of prefill, of a worker whose batch slots all run other "
        "adapters (--max-loras-per-batch): the request waits for one to drain.",
    )
    kv_predict_ttl_s: float = Field(
        DEFAULT_PREDICT_TTL_S,
        gt=0,
        le=3600,
        description="kv router: how long a routed prompt's blocks count as cached on the chosen worker "
        "before its KV events confirm them (covers requests that arrive before those events).",
    )
    kv_snapshot_timeout_s: float = Field(
        5.0,
        gt=0,
        le=300,
        description="kv router: bound on a worker's answer to the snapshot request (the blocks it already "
        "holds) sent when the frontend first sees it.",
    )
    max_inflight: int = Field(
        1024,
        ge=1,
        description="Requests in flight at once; more are refused at once with 503 'overloaded'.",
        json_schema_extra={"env": contract.ENV_HTTP_MAX_INFLIGHT},
    )
    # --- API keys (http.auth) -----------------------------------------------------------------
    api_key: SecretStr | None = Field(
        None,
        description="Require 'Authorization: Bearer <key>' on every route but /health, /live and /metrics "
        "(401 in OpenAI's error shape otherwise). Prefer the environment variable, set from a Secret, to "
        "the flag, which other users of the machine can read in the process list.",
        json_schema_extra={"env": contract.ENV_API_KEY, "metavar": "KEY"},
    )
    api_key_file: Path | None = Field(
        None,
        description="A file of API keys, one a line (blank lines and #-comments skipped): any of them is "
        "accepted, with --api-key's too (several keys: rotate without downtime).",
        json_schema_extra={"env": contract.ENV_API_KEY_FILE, "metavar": "FILE"},
    )
    # --- admission: wait queue and scale from zero (serving.admission, models.registry) ----------
    max_queued_requests: int = Field(
        256,
        ge=0,
        description="Requests of one model that wait for a slot of its workers (or for a worker, while it "
        "scales up); one more is answered 429 'queue_full', unless it outranks a waiting one "
        "(x-dynamo-request-priority), which gets the 429 instead. 0: no queue.",
    )
    queue_ttl_s: float = Field(
        60.0,
        gt=0,
        le=86400,
        description="How long a request waits for a slot while its model's workers are busy before it is "
        "answered 503 'queue_timeout' (llm-d's defaultRequestTTL); a request may ask for less with the "
        "x-llm-d-inference-ttl header or nvext.request_ttl.",
    )
    scale_up_timeout_s: float = Field(
        300.0,
        gt=0,
        le=86400,
        description="How long a request for a model that no worker serves now (scaling from zero, its "
        "workers restarting) is held for one to register before it is answered 503 'model_scaling_up' "
        "(llm-d's noEndpointRequestTTL). Meanwhile dynamo_frontend_queued_requests tells the planner or "
        "a KEDA scaler there is demand. A migrating stream that finds no worker of its role (the only one "
        "is restarting its engine) waits as long for one.",
    )
    model_retention_s: float = Field(
        600.0,
        ge=0,
        le=30 * 86400,
        description="How long a model whose last worker left stays listed in /v1/models, with its "
        "requests held for a worker to come back (--scale-up-timeout-s); 0: it goes at once.",
    )
    graph_models: str = Field(
        "",
        description="Comma-separated models this frontend always lists and holds requests for, even with "
        "no worker (the operator sets the served model names of its graph's workers, so a graph at 0 "
        "replicas keeps its models).",
        json_schema_extra={"env": contract.ENV_GRAPH_MODELS},
    )
    connect_timeout_s: float = Field(
        DEFAULT_CONNECT_TIMEOUT_S,
        gt=0,
        le=300,
        description="Bound on connecting to a worker's request plane.",
    )
    first_token_timeout_s: float = Field(
        DEFAULT_FIRST_TOKEN_TIMEOUT_S,
        gt=0,
        le=3600,
        description="Bound on a worker's first token (queueing + prefill, incl. the KV transfer in "
        "disaggregated serving) and on a prefill leg's completion.",
    )
    inter_token_timeout_s: float = Field(
        DEFAULT_INTER_TOKEN_TIMEOUT_S,
        gt=0,
        le=3600,
        description="Bound on the gap between two tokens of a stream; for a request that is not streamed "
        "(its tokens come every 50 decode steps), between two such batches.",
    )
    kv_transfer_timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="Bound on a disaggregated request's KV handoff: from sending its prefill and decode "
        "legs to the decode leg's first token (prefill queueing, the prefill, SGLang's bootstrap handshake "
        "and the KV transfer). Past it both legs are cancelled (the workers abort them in SGLang, which "
        "frees their KV cache) and the request goes once to another prefill/decode pair, else the client "
        "gets 504 kv_transfer_timeout. Raise it if prefills legitimately queue this long under load.",
    )
    pair_warmup_timeout_s: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="Bound on the warm-up request the frontend sends through every new prefill/decode "
        "worker pair, which opens their KV transfer connection (NIXL: seconds) before user requests use it. "
        "User requests go to warm pairs while there is one, /health waits (this long at most) for a model's "
        "first warm pair, and a failed warm-up is logged and retried. 0: no warm-ups.",
    )
    migration_limit: int = Field(
        1,
        ge=0,
        le=16,
        description="Times a request whose worker is lost mid-stream (died, broke or stalled the stream, "
        "drained) is continued on another worker of its role, with the prompt plus the tokens already "
        "streamed; 0: off, the client gets the error (NVIDIA Dynamo's flag; its default is 0).",
    )
    model_load_timeout_s: float = Field(
        60.0, gt=0, le=3600, description="Bound on fetching a model card and loading its tokenizer."
    )
    embedding_batch_window_ms: float = Field(
        2.0,
        ge=0.0,
        le=1000.0,
        description="Embedding requests of one model arriving within this window go to a worker together.",
    )
    model_cache_dir: Path | None = Field(
        None,
        description="Where fetched model cards (tokenizer files) are kept; default: a temporary folder.",
    )
    # --- images (requests.chat_images, serving.image_generation) ------------------------------------------
    allow_private_image_urls: bool = Field(
        False,
        description="Fetch image URLs whose host is a private, loopback or link-local address (off: "
        "only public addresses, so a request cannot reach inside the cluster).",
    )
    image_fetch_timeout_s: float = Field(
        10.0, gt=0, le=600, description="Bound on fetching one image URL, redirects included."
    )
    max_image_bytes: int = Field(
        20 * 1024 * 1024, ge=1024, description="Largest image file a request may send or link to (bytes)."
    )
    max_images_per_request: int = Field(16, ge=1, le=64, description="Images one chat request may carry.")
    encode_timeout_s: float = Field(
        120.0, gt=0, le=3600, description="Bound on an encode worker's answer (image embeddings)."
    )
    image_generation_timeout_s: float = Field(
        600.0, gt=0, le=3600, description="Bound on a diffusion worker's answer to /v1/images/generations."
    )

    _api_keys: tuple[bytes, ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _read_api_keys(self) -> FrontendSettings:
        """The accepted keys, from --api-key and --api-key-file; no message quotes a key."""
        keys = [self.api_key.get_secret_value()] if self.api_key is not None else []
        if keys and not keys[0].strip():
            raise ValueError("--api-key / DYN_API_KEY is blank: give a key, or unset it to serve without one")
        if self.api_key_file is not None:
            try:
                lines = self.api_key_file.read_text().splitlines()
            except (OSError, UnicodeDecodeError) as e:
                reason = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
                raise ValueError(f"--api-key-file {self.api_key_file}: cannot read it ({reason})") from None
            found = [k.strip() for k in lines if k.strip() and not k.lstrip().startswith("#")]
            if not found:
                raise ValueError(f"--api-key-file {self.api_key_file} holds no key (one key a line)")
            keys += found
        self._api_keys = tuple(k.strip().encode() for k in keys)
        return self

    def kv_weights(self) -> KvWeights:
        """The kv policy's knobs: each field of ``KvWeights`` from the setting named ``kv_<field>``."""
        return KvWeights(**{f.name: getattr(self, f"kv_{f.name}") for f in dataclasses.fields(KvWeights)})

    def api_keys(self) -> tuple[bytes, ...]:
        """Every accepted API key (empty: the API is open)."""
        return self._api_keys

    @classmethod
    def parser(cls) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            prog="python -m dynamo_worker.frontend",
            description=(
                "OpenAI-compatible frontend. Serves POST /v1/chat/completions (with images when the model "
                "has encode workers), POST /v1/completions, POST /v1/embeddings, "
                "POST /v1/images/generations, "
                "GET /v1/models, /health (200 once a model is listed), /live and /metrics. Workers are "
                "found in discovery (NATS JetStream KV) under --namespace; models appear with them and "
                "stay listed, their requests held, while they scale from zero (--graph-models, "
                "--model-retention-s). A model's requests beyond its workers' slots wait in a bounded "
                "queue by priority and deadline (--max-queued-requests, --queue-ttl-s). When a model has "
                "prefill and decode workers, requests are served disaggregated (both legs sent "
                "concurrently with one bootstrap room, to a pair of one revision)."
            ),
        )
        add_model_arguments(parser, cls, "frontend")
        return parser

    @classmethod
    def parse(
        cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
    ) -> FrontendSettings:
        settings, _ = cls.parse_known(argv, env)
        return settings

    @classmethod
    def parse_known(
        cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
    ) -> tuple[FrontendSettings, list[str]]:
        """Settings and the arguments this frontend does not know (flags of NVIDIA Dynamo's frontend in
        manifests written for it): the caller logs them and carries on."""
        args, unknown = cls.parser().parse_known_args(argv)
        return settings_from_args(cls, args, env), unknown
