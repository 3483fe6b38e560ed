"""Settings of ``python -m dynamo_worker.bench``: every knob a typed field with help; the CLI is derived
from them. The only module of ``dynamo_worker.bench`` that reads the environment (``OPENAI_API_KEY``)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from dynamo_api import contract
from dynamo_api.settings_sources import Settings
from pydantic import Field, field_validator

from dynamo_worker.bench.workload import LengthDist
from dynamo_worker.runtime.settings import add_model_arguments, settings_from_args

__all__ = ["BenchSettings"]


class BenchSettings(Settings):
    """One load run against an OpenAI-compatible endpoint."""

    url: str = Field(
        f"http://127.0.0.1:{contract.FRONTEND_PORT}", description="Server root (with or without /v1)."
    )
    model: str = Field(..., description="Model name to request (see GET /v1/models).")
    api_key: str | None = Field(
        None, description="Sent as 'Authorization: Bearer'.", json_schema_extra={"env": "OPENAI_API_KEY"}
    )
    api: Literal["chat", "completions"] = Field(
        "chat",
        description="chat: /v1/chat/completions; completions: /v1/completions (messages joined).",
        json_schema_extra={"metavar": "{chat,completions}"},
    )
    mode: Literal["closed", "open"] = Field(
        "closed",
        description="closed: --concurrency senders back to back; open: Poisson arrivals at --rate.",
        json_schema_extra={"metavar": "{closed,open}"},
    )
    concurrency: int = Field(8, ge=1, le=10000, description="Closed loop: requests in flight at once.")
    rate: float = Field(10.0, gt=0, description="Open loop: mean arrivals per second.")
    num_requests: int = Field(200, ge=1, description="Hard cap on requests sent.")
    duration: float = Field(60.0, gt=0, description="Hard cap on seconds spent sending requests.")
    drain: float = Field(
        30.0, ge=0, description="Seconds requests in flight at the end may still take before cancellation."
    )
    timeout: float = Field(120.0, gt=0, description="Bound on one request, from send to its last chunk.")
    workload: Literal["random", "shared-prefix"] = Field(
        "random",
        description="random: one user message of --input-len words; shared-prefix: --num-prefixes "
        "system prompts x --users-per-prefix users, --turns turns each, conversations growing per turn.",
        json_schema_extra={"metavar": "{random,shared-prefix}"},
    )
    input_len: str = Field(
        "fixed:128",
        description="Words per user message (about one token each): fixed:N, uniform:LO,HI or "
        "normal:MEAN,STD[,LO,HI].",
    )
    output_len: str = Field("fixed:64", description="max_tokens per request, same syntax as --input-len.")
    ignore_eos: bool = Field(
        True,
        description="Send ignore_eos so the output length is exactly max_tokens where the server honours it.",
    )
    num_prefixes: int = Field(4, ge=1, description="shared-prefix: distinct system prompts.")
    users_per_prefix: int = Field(8, ge=1, description="shared-prefix: users sharing each system prompt.")
    turns: int = Field(3, ge=1, description="shared-prefix: turns per user.")
    prefix_len: int = Field(512, ge=1, description="shared-prefix: words per system prompt.")
    warmup: int = Field(0, ge=0, description="Requests sent (at --concurrency) and discarded before the run.")
    seed: int = Field(0, description="Seed of prompts, lengths and arrival times.")
    json_out: Path | None = Field(None, description="Also write the report (and the settings) as JSON here.")

    @field_validator("input_len", "output_len")
    @classmethod
    def _length(cls, v: str) -> str:
        LengthDist.parse(v)
        return v

    @classmethod
    def parser(cls) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            prog="python -m dynamo_worker.bench",
            description="Load generator for any OpenAI-compatible endpoint: streams requests (SSE), "
            "measures TTFT, inter-token and end-to-end latency from chunk arrival times, throughput, "
            "errors by type and prefix-cache hit rate, and prints a table (and JSON with --json-out).",
        )
        add_model_arguments(parser, cls, "load")
        return parser

    @classmethod
    def parse(cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> BenchSettings:
        return settings_from_args(cls, cls.parser().parse_args(argv), env)
