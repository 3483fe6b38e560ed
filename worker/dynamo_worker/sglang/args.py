"""The command line of ``python -m dynamo_worker.sglang``: our flags, then SGLang's own.

Our flags are the runtime's (``RuntimeSettings``: namespace, component, endpoint, NATS, ports, grace
period) and this worker's (``SglangSettings``). Every other argument goes to SGLang's own parser
(``ServerArgs.add_cli_args``) and becomes a ``ServerArgs`` through ``ServerArgs.from_cli_args``, so
every SGLang server flag works as it does for ``sglang.launch_server``; ``--config FILE`` too (SGLang's
config merger, from whichever module path the installed release has). A flag the installed SGLang does
not have (one it removed, or one of a newer release) is refused before anything starts, with a message
that names it, the installed version and the fix; so are SGLang's own parse errors (no argparse exit).

What the frontend contract needs is forced, and logged (``contract_overrides``): token ids in and out
(``skip_tokenizer_init`` when ``--grammar-backend none``; with a grammar backend, SGLang's default
xgrammar, SGLang keeps its tokenizer, because its grammar backend compiles grammars against the
vocabulary and SGLang disables grammars under ``--skip-tokenizer-init``; we still send token ids and
read ``output_ids``), disjoint streaming (``incremental_streaming_output``), SGLang's servers on
our listen host unless ``--host`` is given, and for a prefill worker without
``--disaggregation-bootstrap-port`` a free port (the engine checks SGLang really bound it and retries
on another one if not: ``WorkerPlan.build_server_args`` builds a new ``ServerArgs`` for it, as
``ServerArgs`` is read-only once constructed).

LoRA with ``--load-format dummy``: SGLang reads an adapter's weights with the engine's own load
config (``LoRAAdapter.initialize_weights`` builds a ``DefaultModelLoader`` from it, 0.5.17 to 0.5.23),
and under ``dummy`` that loader refuses to read any file, so no adapter can ever be loaded
(``lora_blocked``). ``--lora-paths`` with it is refused before anything starts; ``--enable-lora`` with it
starts (the base model serves), says so loudly, and ``/v1/loras`` refuses every load
(``LoraNotSupported``).

``--help`` works without SGLang installed and says how to install it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from dynamo_api import contract, modules
from dynamo_api.errors import DynamoError
from dynamo_api.settings_sources import Settings
from pydantic import Field

from dynamo_worker.runtime.lora_checks import dummy_weights_block
from dynamo_worker.runtime.model_files import is_embedding_model
from dynamo_worker.runtime.settings import RuntimeSettings, add_model_arguments, settings_from_args
from dynamo_worker.sglang.uses import CONFIG_PARSER_MODULES, FLAG_REPLACEMENTS, REMOVED_FLAGS, SGLANG_WINDOW

__all__ = [
    "INSTALL_HINT",
    "SglangCli",
    "SglangSettings",
    "WorkerArgsError",
    "WorkerPlan",
    "bootstrap_host",
    "contract_overrides",
    "kv_event_endpoints",
    "load_sglang_cli",
    "lora_blocked",
    "parse_sglang_args",
    "parse_worker_args",
    "pick_free_port",
    "unknown_flag_message",
]

PROG = f"python -m {modules.SGLANG_MODULE}"
_KV_EVENTS_ENDPOINT = f"tcp://*:{contract.KV_EVENTS_PORT}"  # SGLang's default publisher endpoint
OLDEST, NEWEST = SGLANG_WINDOW
INSTALL_HINT = (
    "SGLang is not installed: install the worker's engine with pip install 'dynamo-sglang[sglang]' "
    f"(SGLang {OLDEST} to {NEWEST}; it needs a CUDA GPU), or run the simulated engine: "
    f"python -m {modules.MOCKER_MODULE}"
)


class WorkerArgsError(DynamoError, ValueError):
    """The command line cannot start a worker; the message names the flag and the fix."""


class SglangSettings(Settings):
    """Settings of the SGLang worker itself (bounds of its waits, its background checks)."""

    engine_start_timeout_s: float = Field(
        1800.0, gt=0, description="Seconds SGLang may take to load the model and come up."
    )
    capacity_timeout_s: float = Field(
        30.0, gt=0, description="Seconds to wait for SGLang's first load report (KV capacity) after startup."
    )
    canary_interval_s: float = Field(
        10.0, gt=0, description="Seconds between two canary requests that prove the scheduler answers."
    )
    canary_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Seconds a canary request may take; then SGLang's queues say why: busy (requests "
        "running or waiting: /health stays 200), or blocked or a stuck KV transfer (/health turns 503).",
    )
    warmup_timeout_s: float = Field(
        300.0,
        ge=0,
        description="Bound on the requests the worker sends SGLang itself before it registers (prompts "
        "alone and batched, greedy and sampled): the first forward passes load and compile kernels "
        "(seconds on a new pod), which the first user requests would otherwise wait for. 0: no warmup.",
    )
    load_interval_s: float = Field(
        0.05,
        gt=0,
        description="Seconds between two reads of SGLang's load (event plane and /metrics): a read of what "
        "its schedulers wrote to shared memory, which costs them nothing; routers weigh it in.",
    )


@dataclass
class WorkerPlan:
    """Everything a worker process needs, decided from its command line."""

    server_args: Any  # sglang.srt.server_args.ServerArgs (or a stand-in with the same attributes)
    runtime: RuntimeSettings
    settings: SglangSettings = field(default_factory=SglangSettings)
    bootstrap_port_chosen: bool = False  # True: we picked the prefill bootstrap port, retry on conflict
    bootstrap_host: str | None = None
    fake_bootstrap_host: str = "2.2.2.2"
    overrides: list[str] = field(default_factory=list)  # what we forced, for the log
    # A new ServerArgs from the same command line with some values changed (ServerArgs is read-only
    # once constructed); None where the plan was not built from a command line.
    build_server_args: Callable[[Mapping[str, Any]], Any] | None = None


@dataclass(frozen=True)
class SglangCli:
    """What the command line needs of the installed SGLang (``load_sglang_cli``)."""

    version: str
    server_args_class: Any  # has from_cli_args(namespace) and add_cli_args(parser)
    config_merger: Any  # ConfigArgumentMerger (its module moved in 0.5.19); None if neither exists
    fake_bootstrap_host: str


def load_sglang_cli() -> SglangCli:
    """The installed SGLang's ``ServerArgs``, config merger and version; ``WorkerArgsError`` (with how
    to install it) when SGLang is missing."""
    try:
        from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST
        from sglang.srt.server_args import ServerArgs
    except ImportError as e:
        raise WorkerArgsError(f"{INSTALL_HINT} ({e})") from None
    merger = None
    for module in CONFIG_PARSER_MODULES:
        try:
            merger = importlib.import_module(module).ConfigArgumentMerger
            break
        except ImportError:
            continue
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = "(unknown version)"
    return SglangCli(
        version=version,
        server_args_class=ServerArgs,
        config_merger=merger,
        fake_bootstrap_host=FAKE_BOOTSTRAP_HOST,
    )


def pick_free_port(host: str = "0.0.0.0") -> int:
    """A port free on ``host`` right now (the caller checks the bind it hands it to)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _given(argv: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def contract_overrides(
    ns: argparse.Namespace,
    sglang_argv: Sequence[str],
    runtime: RuntimeSettings,
    embedding: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The ``ServerArgs`` values the frontend contract needs that differ from ``ns``, and one log
    line for each. Pure: the caller applies them (a prefill port of 0 means: pick a free port).
    ``embedding``: why the model is to be served as an embedding model (None: it is not)."""
    values: dict[str, Any] = {}
    notes: list[str] = []
    if embedding is not None and not ns.is_embedding:
        values["is_embedding"] = True
        notes.append(f"Set --is-embedding: {embedding}")
    if not ns.skip_tokenizer_init:
        if getattr(ns, "grammar_backend", None) == "none":
            values["skip_tokenizer_init"] = True
            notes.append("Forced --skip-tokenizer-init: the frontend tokenizes; token ids in and out")
        else:
            notes.append(
                "Kept SGLang's tokenizer (no --skip-tokenizer-init): its grammar backend needs it for "
                "structured output; token ids still go in and out. Pass --grammar-backend none to skip it"
            )
    if not ns.incremental_streaming_output:
        values["incremental_streaming_output"] = True
        notes.append("Forced --incremental-streaming-output: each streamed chunk carries only new token ids")
    if not _given(sglang_argv, "--host"):
        values["host"] = runtime.listen_host
        notes.append(f"Set --host {runtime.listen_host} (from --listen-host) for SGLang's bootstrap server")
    if ns.disaggregation_mode == "prefill" and not _given(sglang_argv, contract.BOOTSTRAP_PORT_FLAG):
        values["disaggregation_bootstrap_port"] = 0
        notes.append("Chose a free --disaggregation-bootstrap-port (none given); discovery publishes it")
    return values, notes


def lora_blocked(server_args: Any) -> str | None:
    """Why an engine with these server arguments (``ServerArgs``, or SGLang's parsed namespace) runs
    with LoRA but can load no adapter, and the fix; None when LoRA is off or adapters can load."""
    return dummy_weights_block(
        bool(server_args.enable_lora or server_args.lora_paths), server_args.load_format
    )


def bootstrap_host(server_args: Any, runtime: RuntimeSettings) -> str:
    """Where decode workers reach this prefill worker's bootstrap server: the leader's dist-init host
    for a multinode engine, else the advertised host (the pod IP in Kubernetes)."""
    addr: str | None = getattr(server_args, "dist_init_addr", None)
    if getattr(server_args, "nnodes", 1) > 1 and addr:
        host = addr.rsplit(":", 1)[0] if ":" in addr else addr
        return host.strip("[]")
    return runtime.advertise_host


def kv_event_endpoints(kv_events_config: str | None, dp_size: int) -> list[str]:
    """The ZMQ endpoints SGLang publishes KV events on (one per data-parallel rank, SGLang adds the
    rank to the port), as addresses to connect to; empty when publishing is off."""
    if not kv_events_config:
        return []
    try:
        config = json.loads(kv_events_config)
    except json.JSONDecodeError as e:
        raise WorkerArgsError(
            f"--kv-events-config is not JSON ({e}); pass e.g. "
            f'\'{{"publisher": "zmq", "endpoint": "{_KV_EVENTS_ENDPOINT}"}}\''
        ) from None
    if config.get("publisher", "null") != "zmq":
        return []
    endpoint = str(config.get("endpoint") or _KV_EVENTS_ENDPOINT)
    if not endpoint.startswith("tcp://"):  # ipc:// or inproc://: SGLang suffixes _dp<rank> for rank > 0
        return [f"{endpoint}_dp{rank}" if rank else endpoint for rank in range(dp_size)]
    host, port = endpoint[len("tcp://") :].rsplit(":", 1)
    if host in ("*", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return [f"tcp://{host}:{int(port) + rank}" for rank in range(dp_size)]


def _our_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Serve an in-process SGLang engine as a worker of a graph (role from --disaggregation-mode: "
            "null = aggregated, prefill, decode). All flags not listed here go to SGLang's ServerArgs."
        ),
        add_help=False,
        allow_abbrev=False,
    )
    parser.add_argument("-h", "--help", action="store_true", help="Show this help (and SGLang's flags).")
    RuntimeSettings.add_arguments(parser)
    add_model_arguments(parser, SglangSettings, "sglang worker")
    return parser


class _SglangParser(argparse.ArgumentParser):
    """SGLang's flags; a parse error raises ``WorkerArgsError`` instead of exiting the process."""

    def __init__(self, version: str) -> None:
        # SGLang's own parser allows abbreviations (manifests say --tp for --tp-size); ours does not,
        # so that it never takes an abbreviated SGLang flag for one of ours.
        super().__init__(prog=f"{PROG} (SGLang {version} server arguments)")
        self.sglang_version = version

    def error(self, message: str) -> NoReturn:
        raise WorkerArgsError(
            f"SGLang {self.sglang_version} refused the command line: {message} "
            f"(see {PROG} --help for the flags of the installed SGLang)"
        )


def _sglang_parser(cli: SglangCli) -> _SglangParser:
    parser = _SglangParser(cli.version)
    cli.server_args_class.add_cli_args(parser)
    return parser


def unknown_flag_message(flag: str, version: str) -> str:
    """Why ``flag`` cannot run on SGLang ``version``, and what to do."""
    text = f"{flag} is not a flag of the installed SGLang {version}"
    if flag in REMOVED_FLAGS:
        text += f" (SGLang {OLDEST} has it; later releases removed it)"
    if flag in FLAG_REPLACEMENTS:
        text += f"; use {FLAG_REPLACEMENTS[flag]} instead"
    text += "; remove it from the worker's arguments (or its --config file)"
    if flag in REMOVED_FLAGS or flag in FLAG_REPLACEMENTS:
        text += f", or run an SGLang that has it (this worker supports SGLang {OLDEST} to {NEWEST})"
    return text


def parse_sglang_args(parser: _SglangParser, argv: Sequence[str]) -> argparse.Namespace:
    """SGLang's namespace for ``argv``; ``WorkerArgsError`` for a flag SGLang does not have (named,
    with the installed version) or any other parse error."""
    known = parser._option_string_actions
    for token in argv:
        flag = token.split("=", 1)[0]
        # A removed flag can still abbreviate a longer one (--cuda-graph-bs): name it, not argparse's guess.
        named = flag in REMOVED_FLAGS or flag in FLAG_REPLACEMENTS
        if flag.startswith("--") and flag not in known and named:
            raise WorkerArgsError(unknown_flag_message(flag, parser.sglang_version))
    ns, extra = parser.parse_known_args(list(argv))
    if extra:
        flags = [t.split("=", 1)[0] for t in extra if t.startswith("-")]
        if flags:
            raise WorkerArgsError(unknown_flag_message(flags[0], parser.sglang_version))
        raise WorkerArgsError(
            f"SGLang {parser.sglang_version} takes no positional arguments, got {' '.join(extra)!r}; "
            "give every value after its flag"
        )
    return ns


def help_text() -> str:
    text = _our_parser().format_help()
    try:
        return text + "\n" + _sglang_parser(load_sglang_cli()).format_help()
    except WorkerArgsError:
        sglang_flags = "SGLang server arguments (--model-path, --tp, --disaggregation-mode, ...)"
        return f"{text}\n{sglang_flags}:\n{INSTALL_HINT}\n"


def _our_settings(
    ours: argparse.Namespace, env: Mapping[str, str] | None
) -> tuple[RuntimeSettings, SglangSettings]:
    """Our own flags (and env): the runtime's settings, and the worker's."""
    given = {k: v for k, v in vars(ours).items() if k != "help"}
    runtime_keys = RuntimeSettings.model_fields.keys()
    runtime = RuntimeSettings.from_args({k: v for k, v in given.items() if k in runtime_keys}, env)
    own = {k: v for k, v in given.items() if k not in runtime_keys}
    return runtime, settings_from_args(SglangSettings, own, {})


def _merge_config(cli: SglangCli, parser: argparse.ArgumentParser, rest: list[str]) -> list[str]:
    """SGLang's flags with a ``--config FILE`` merged in by SGLang's own merger."""
    # SGLang's merger finds only "--config FILE"; "--config=FILE" would be parsed and ignored.
    rest = [
        p for a in rest for p in (["--config", a[len("--config=") :]] if a.startswith("--config=") else [a])
    ]
    if "--config" not in rest:
        return rest
    if cli.config_merger is None:
        raise WorkerArgsError(
            f"SGLang {cli.version} has no config file merger (looked for "
            f"{' and '.join(CONFIG_PARSER_MODULES)}); give the flags on the command line, not --config"
        )
    try:
        merged: list[str] = cli.config_merger(parser).merge_config_with_args(rest)
        return merged
    except (OSError, ValueError) as e:
        raise WorkerArgsError(f"--config: {e}; pass a readable YAML file of SGLang flags") from None


def _embedding(embedding_worker: bool, model_path: str) -> str | None:
    """Why the worker serves embeddings (None: it generates)."""
    if embedding_worker:
        return "--embedding-worker (NVIDIA Dynamo's flag)"
    if is_embedding_model(model_path):
        return f"{model_path}'s sentence-transformers modules pool its output (an embedding model)"
    return None


def parse_worker_args(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, sglang: SglangCli | None = None
) -> WorkerPlan:
    """Parse the worker's command line into a ``WorkerPlan``; prints help and exits for ``--help``.
    Raises ``WorkerArgsError`` (or ``SettingsError``) for a command line it cannot run. ``sglang``:
    the installed SGLang's parts (default: ``load_sglang_cli()``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, rest = _our_parser().parse_known_args(argv)
    if ours.help:
        print(help_text())
        raise SystemExit(0)
    runtime, settings = _our_settings(ours, env)
    cli = sglang or load_sglang_cli()
    parser = _sglang_parser(cli)
    rest = _merge_config(cli, parser, rest)
    embedding_worker = "--embedding-worker" in rest  # NVIDIA Dynamo's flag, SGLang has none
    rest = [a for a in rest if a != "--embedding-worker"]
    ns = parse_sglang_args(parser, rest)
    if ns.lora_paths and (why := lora_blocked(ns)):
        raise WorkerArgsError(f"--lora-paths cannot be loaded with --load-format dummy: {why}")
    values, notes = contract_overrides(ns, rest, runtime, _embedding(embedding_worker, ns.model_path))
    chosen = values.get("disaggregation_bootstrap_port") == 0
    if chosen:
        values["disaggregation_bootstrap_port"] = pick_free_port(values.get("host", ns.host))
    for key, value in values.items():
        setattr(ns, key, value)
    server_args_class = cli.server_args_class

    def build_server_args(changes: Mapping[str, Any]) -> Any:
        return server_args_class.from_cli_args(argparse.Namespace(**{**vars(ns), **changes}))

    try:
        server_args = build_server_args({})
    except (ValueError, AssertionError) as e:  # SGLang's own validation of the values
        raise WorkerArgsError(f"SGLang {cli.version} refused the server arguments: {e}") from None
    return WorkerPlan(
        server_args=server_args,
        runtime=runtime,
        settings=settings,
        bootstrap_port_chosen=chosen,
        bootstrap_host=bootstrap_host(server_args, runtime),
        fake_bootstrap_host=cli.fake_bootstrap_host,
        overrides=notes,
        build_server_args=build_server_args,
    )
