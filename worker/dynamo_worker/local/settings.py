"""dynamo-run's settings: the typed model its CLI is derived from, and the only place it reads env.

Precedence: a flag beats its environment variable, which beats the default (``--help`` lists both).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from dynamo_api import contract
from dynamo_api.settings_sources import Settings, env_value
from pydantic import Field
from pydantic_settings import CliSuppress

from dynamo_worker.runtime.settings import add_model_arguments, cache_root, settings_from_args

__all__ = ["RunSettings", "parse_args"]

DESCRIPTION = """\
Run a DynamoGraphDeployment manifest on this machine, with no Kubernetes: an embedded nats-server,
the frontend, and every worker replica as local processes with the environment the operator gives
its pods. Workers run on SGLang when it is installed and GPUs are visible, else on the mocker (a
simulated engine serving the manifest's --served-model-name with a tiny tokenizer). A planner
(python3 -m dynamo_worker.planner) runs with --dry-run on the local frontend's metrics: it decides and
explains every interval, but cannot change the replicas of local processes. DynamoModel documents in
the file (LoRA adapters) are loaded on every worker serving their base model once the workers are up.
"""

EPILOG = """\
examples:
  dynamo-run examples/disagg.yaml
  dynamo-run examples/agg.yaml --engine mocker --port 8080
  CUDA_VISIBLE_DEVICES=2,3 dynamo-run examples/disagg.yaml --engine sglang
  dynamo-run examples/disagg-planner.yaml     # with its planner, in dry-run mode
  dynamo-run examples/lora-disagg.yaml        # and its DynamoModels: LoRA adapters on every worker

Ctrl-C (or SIGTERM) stops every process: SIGTERM, --grace-period seconds, then SIGKILL.
When a worker dies after startup dynamo-run reports it with its last log lines and keeps the rest
serving (requests that need it fail with a clear error); with --restart always it also starts it again
(a multinode worker's whole group), as Kubernetes would; when the frontend or NATS dies it stops all,
unless --restart always, which starts them again too (nats-server on its port, with its store).
API key: DYN_API_KEY (or DYN_API_KEY_FILE, one key a line) in this shell reaches the frontend, which
then requires 'Authorization: Bearer <key>' (the openai client's api_key).
Exit status: 0 after Ctrl-C/SIGTERM, 1 when a process failed, 2 when the manifest cannot run here.
"""


class RunSettings(Settings):
    """How dynamo-run serves one manifest here."""

    engine: Literal["auto", "mocker", "sglang"] = Field(
        "auto",
        description="Engine of the SGLang workers: auto picks sglang when it is importable and GPUs are "
        "visible, else the mocker.",
        json_schema_extra={"env": "DYN_RUN_ENGINE", "metavar": "{auto,mocker,sglang}"},
    )
    port: int = Field(
        contract.FRONTEND_PORT,
        ge=1,
        le=65535,
        description="Port of the frontend's OpenAI API.",
        json_schema_extra={"env": contract.ENV_HTTP_PORT},
    )
    host: str = Field(
        "127.0.0.1",
        description="Interface the frontend listens on (0.0.0.0 to serve other machines).",
        json_schema_extra={"env": "DYN_RUN_HOST"},
    )
    model_dir: Path | None = Field(
        None,
        description="Model folder. Mocker: the tokenizer folder behind --served-model-name (a generated "
        "tiny model when unset). SGLang: replaces the workers' --model-path.",
        json_schema_extra={"env": "DYN_RUN_MODEL_DIR", "metavar": "DIR"},
    )
    adapter_dir: Path | None = Field(
        None,
        description="Folder that relative file:// sources (file://adapters/x) of the manifest's DynamoModels "
        "resolve against; the manifest's folder when unset. With SGLang, the adapters made for the model of "
        "--model-dir.",
        json_schema_extra={"env": "DYN_RUN_ADAPTER_DIR", "metavar": "DIR"},
    )
    log_dir: Path | None = Field(
        None,
        description="Folder for one log file per process (kept). Unset: a temporary folder, removed on a "
        "clean stop and kept when a process failed.",
        json_schema_extra={"env": "DYN_RUN_LOG_DIR", "metavar": "DIR"},
    )
    cache_dir: Path = Field(
        default_factory=cache_root,
        description="Where the generated tiny model is kept between runs.",
        json_schema_extra={"env": "DYN_RUN_CACHE_DIR", "metavar": "DIR"},
    )
    startup_timeout: float | None = Field(
        None,
        gt=0,
        description="Seconds every process gets to become ready (default: 120 on the mocker, 1800 on "
        "SGLang, which loads weights and captures CUDA graphs).",
        json_schema_extra={"env": "DYN_RUN_STARTUP_TIMEOUT", "metavar": "S"},
    )
    grace_period: float = Field(
        10.0,
        ge=0,
        le=600,
        description="Seconds processes get to drain after SIGTERM before SIGKILL (also their "
        f"{contract.ENV_GRACEFUL_SHUTDOWN_S}).",
        json_schema_extra={"env": "DYN_RUN_GRACE_PERIOD", "metavar": "S"},
    )
    restart: Literal["never", "always"] = Field(
        "never",
        description="A worker process that exits after startup: never started again (the failure stays "
        "visible; restart dynamo-run), or always started again as Kubernetes restarts the container of a "
        "pod whose restartPolicy is Always (at once, then after 10 s, 20 s, ... up to 300 s while it keeps "
        "exiting within 10 minutes of starting), with every pod of its multinode group, as the operator "
        "restarts a group. The frontend is started again the same way, and nats-server at once on its "
        "port (never: either exiting stops everything).",
        json_schema_extra={"env": "DYN_RUN_RESTART", "metavar": "{never,always}"},
    )
    frontend_api_key: CliSuppress[bool] = Field(  # no flag: parse_args sets it
        False,
        description=f"Whether the frontend requires an API key: {contract.ENV_API_KEY} or "
        f"{contract.ENV_API_KEY_FILE} is set in dynamo-run's environment, which every process inherits.",
    )
    cuda_visible_devices: CliSuppress[str | None] = Field(  # no flag: parse_args passes it
        None, description="GPUs workers may use; read from CUDA_VISIBLE_DEVICES ('' hides every GPU)."
    )

    def startup_timeout_for(self, engine: str) -> float:
        if self.startup_timeout is not None:
            return self.startup_timeout
        return 1800.0 if engine == "sglang" else 120.0


def parse_args(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> tuple[Path, RunSettings]:
    """The manifest path and the settings, from flags, then env, then defaults."""
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(
        prog="dynamo-run",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "manifest", type=Path, help="a DynamoGraphDeployment YAML file, e.g. examples/disagg.yaml"
    )
    add_model_arguments(parser, RunSettings, "dynamo-run")
    ns = parser.parse_args(argv)
    manifest = ns.manifest
    settings = settings_from_args(
        RunSettings,
        ns,
        env=env,
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        frontend_api_key=env_value(env, [contract.ENV_API_KEY, contract.ENV_API_KEY_FILE]) is not None,
    )
    return manifest, settings
