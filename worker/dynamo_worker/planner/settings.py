"""Settings of ``python -m dynamo_worker.planner``: flags, environment, and NVIDIA Dynamo's planner
``--config`` JSON.

Precedence: a flag, then the ``--config`` file, then the environment, then the default. The config
file is Dynamo's ``PlannerConfig`` object (a file path or inline JSON); its fields that mean the same
here are taken (``DYNAMO_FIELDS``), values this planner cannot honour are refused with the fix, and
every other field is named in the ``ignored`` list (logged and reported as an Event at startup).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from dynamo_api import contract
from dynamo_api.settings_sources import Settings
from pydantic import Field, model_validator

from dynamo_worker.planner.forecast import PREDICTORS
from dynamo_worker.runtime.settings import SettingsError, add_model_arguments, settings_from_args

__all__ = ["DYNAMO_FIELDS", "PlannerSettings", "parse_args", "read_dynamo_config"]


class PlannerSettings(Settings):
    """Scale the prefill and decode services of one graph to hold TTFT/ITL targets."""

    graph: str = Field(
        description="The DynamoGraphDeployment to scale (the planner's own graph).",
        json_schema_extra={"env": contract.ENV_GRAPH_NAME},
    )
    namespace: str = Field(
        description="Kubernetes namespace of the graph.",
        json_schema_extra={
            "env": contract.ENV_GRAPH_NAMESPACE,
            "env_fallbacks": [contract.ENV_POD_NAMESPACE],
        },
    )
    mode: Literal["sla", "load"] = Field(
        "sla",
        description="sla: replicas from a profile, a forecast and TTFT/ITL targets; load: one step at a "
        "time from the workers' queue depth and KV usage.",
    )
    scale: Literal["disagg", "prefill", "decode"] = Field(
        "disagg", description="Which roles to scale (Dynamo's mode)."
    )
    profile: str | None = Field(
        None,
        description="Profile file (python -m dynamo_worker.profile) or builtin:<name>; sla mode needs it.",
    )
    ttft_ms: float = Field(500.0, gt=0, description="Time-to-first-token target (mean), ms.")
    itl_ms: float = Field(50.0, gt=0, description="Inter-token latency target (mean), ms.")
    adjustment_interval_s: float = Field(60.0, gt=0, description="Seconds between two decisions.")
    load_predictor: Literal[PREDICTORS] = Field(  # type: ignore[valid-type]
        "constant", description="Forecast of the next interval: constant (last interval) or trend (Holt)."
    )
    max_gpu_budget: int | None = Field(None, ge=1, description="GPUs the scaled roles may use in all.")
    min_replicas: int = Field(1, ge=0, description="Fewest replicas of each scaled role.")
    prefill_gpus: int | None = Field(
        None, ge=1, description="GPUs per prefill replica (default: the graph's gpu limit x nodeCount)."
    )
    decode_gpus: int | None = Field(
        None, ge=1, description="GPUs per decode replica (default: the graph's gpu limit x nodeCount)."
    )
    cooldown_s: float | None = Field(
        None, ge=0, description="Least seconds between a change and a scale-down (default: 2 intervals)."
    )
    down_stable_intervals: int = Field(
        2, ge=1, description="Decisions in a row that must want fewer replicas before scaling down."
    )
    metrics_url: str | None = Field(
        None,
        description="Comma-separated frontend /metrics URLs (default: each frontend Service of the graph).",
    )
    prometheus_url: str | None = Field(
        None, description="Read the frontends' metrics from this Prometheus server instead."
    )
    prometheus_selector: str = Field(
        "", description='Label matchers added to the Prometheus queries, e.g. namespace="ns".'
    )
    model: str | None = Field(None, description="Count only this served model (default: all).")
    metrics_port: int = Field(
        contract.SYSTEM_PORT,
        ge=0,
        le=65535,
        description="Port of the planner's own /metrics (planner_*); 0 picks a free one.",
        json_schema_extra={"env": contract.ENV_SYSTEM_PORT},
    )
    metrics_host: str = Field(
        "0.0.0.0",
        description="Address the /metrics server binds to.",
        json_schema_extra={"env": contract.ENV_LISTEN_HOST},
    )
    dry_run: bool = Field(False, description="Decide, explain and export metrics, but patch nothing.")
    graph_file: str | None = Field(
        None,
        description="Read the graph from this manifest (nvidia.com/v1alpha1 or v1beta1) instead of the "
        "Kubernetes API, and log Events instead of posting them; needs --dry-run (a file scales nothing). "
        "dynamo-run passes it.",
        json_schema_extra={"metavar": "PATH"},
    )
    kubeconfig: str | None = Field(
        None,
        description="Kubeconfig for running outside a pod (default: the pod's service account).",
        json_schema_extra={"env": "KUBECONFIG"},
    )
    nats_server: str | None = Field(
        None,
        description="NATS URL for the workers' load reports (load mode).",
        json_schema_extra={"env": contract.ENV_NATS_SERVER},
    )
    dynamo_namespace: str | None = Field(
        None,
        description="Discovery/event scope of the graph's workers (default: <namespace>-<graph>).",
        json_schema_extra={"env": contract.ENV_NAMESPACE},
    )
    config: str | None = Field(
        None, description="NVIDIA Dynamo planner config: a JSON file or inline JSON (see module docs)."
    )

    @model_validator(mode="after")
    def _graph_file_needs_dry_run(self) -> PlannerSettings:
        if self.graph_file and not self.dry_run:
            raise ValueError(
                f"--graph-file {self.graph_file} reads the graph from a file, where no replicas can be set: "
                "add --dry-run (decisions are logged as 'Would scale ...'), or drop --graph-file to scale "
                "the graph through the Kubernetes API"
            )
        return self

    @property
    def cooldown(self) -> float:
        return self.cooldown_s if self.cooldown_s is not None else 2 * self.adjustment_interval_s

    @property
    def roles(self) -> tuple[str, ...]:
        return ("prefill", "decode") if self.scale == "disagg" else (self.scale,)


# Dynamo's PlannerConfig field -> ours (same meaning, same unit).
DYNAMO_FIELDS = {
    "ttft": "ttft_ms",
    "itl": "itl_ms",
    "adjustment_interval": "adjustment_interval_s",
    "max_gpu_budget": "max_gpu_budget",
    "min_endpoint": "min_replicas",
    "prefill_engine_num_gpu": "prefill_gpus",
    "decode_engine_num_gpu": "decode_gpus",
    "load_predictor": "load_predictor",
    "no_operation": "dry_run",
    "metric_pulling_prometheus_endpoint": "prometheus_url",
    "metric_reporting_prometheus_port": "metrics_port",
}
# Dynamo's fields whose accepted values are checked here.
_CHECKED = {
    "environment": ("kubernetes",),
    "backend": ("sglang", "mocker"),
    "mode": ("disagg", "prefill", "decode"),
    "optimization_target": ("sla", "throughput", "latency", "load"),
}


def read_dynamo_config(source: str) -> tuple[dict[str, Any], list[str]]:
    """Our settings from a Dynamo planner config (a file path or inline JSON), and the names of the
    fields we do not use. Raises ``SettingsError`` for values this planner cannot honour."""
    text = source
    if not source.lstrip().startswith("{"):
        try:
            text = Path(source).read_text()
        except OSError as e:
            raise SettingsError(f"--config {source}: {e.strerror}; pass a JSON file or inline JSON") from e
    try:
        data = json.loads(text)
    except ValueError as e:
        raise SettingsError(f"--config {source!r} is not JSON ({e}); YAML is not read, convert it") from e
    if not isinstance(data, dict):
        raise SettingsError("--config must be a JSON object of PlannerConfig fields")
    out: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in data.items():
        if key in DYNAMO_FIELDS:
            if value is not None:
                out[DYNAMO_FIELDS[key]] = value
        elif key in _CHECKED:
            if value not in _CHECKED[key]:
                raise SettingsError(
                    f"--config {key}={value!r} is not supported here; use one of {', '.join(_CHECKED[key])}"
                )
            if key == "mode":
                out["scale"] = value
            elif key == "optimization_target":
                out["mode"] = "sla" if value == "sla" else "load"
        else:
            ignored.append(key)
    if data.get("load_predictor") not in (None, *PREDICTORS):
        raise SettingsError(
            f"--config load_predictor={data['load_predictor']!r} is not implemented here; use "
            f"{' or '.join(PREDICTORS)} (why: dynamo_worker.planner.forecast)"
        )
    return out, sorted(ignored)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dynamo_worker.planner",
        allow_abbrev=False,
        description="SLA planner: observes the frontends' traffic, forecasts the next interval and patches "
        "the replicas of the graph's prefill and decode services within a GPU budget.",
    )
    add_model_arguments(parser, PlannerSettings, "planner")
    return parser


def parse_args(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> tuple[PlannerSettings, list[str]]:
    """Settings, and the Dynamo config fields that were ignored."""
    given = vars(build_parser().parse_args(argv))
    from_config: dict[str, Any] = {}
    ignored: list[str] = []
    source = given.get("config")
    if source:
        from_config, ignored = read_dynamo_config(source)
    return settings_from_args(PlannerSettings, {**from_config, **given}, env), ignored
