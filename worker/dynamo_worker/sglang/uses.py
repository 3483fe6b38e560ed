"""Everything this package uses of SGLang, in one place: what ``compat`` checks against SGLang's source.

Most of it is *derived from our code* by reading this package's source (AST, nothing imported):

- ``async_generate`` keywords: the keywords of every ``_call_kwargs(...)`` call in ``handler.py``;
- sampling parameter keys: the keys of the dict literals ``handler.py`` passes as ``sampling_params``
  (and returns from ``sampling_params()``);
- ``ServerArgs`` fields: every attribute read or written on a name or attribute called ``server_args``
  (and ``ns`` in ``args.py``, SGLang's parsed namespace), every ``getattr(server_args, "x")``, and the
  string keys ``contract_overrides`` sets;
- modules and names: every ``import sglang...`` / ``from sglang... import x`` in this package.

What our code reaches through objects SGLang hands back (methods, attributes, dict keys, the layout of
a msgpack message) cannot be read off an import, so it is declared below in ``DECLARED``; keep it next
to the code that relies on it by naming the module that does. What moved between the releases of the
window is declared as alternatives (``ONE_OF``): one of them must exist.

The window of SGLang releases the worker supports, ``SGLANG_WINDOW``, is declared here and nowhere else:
the ``[sglang]`` extra in pyproject.toml states the same range (a unit test keeps them equal), and
``hack/sglang-compat.sh`` checks the oldest and the newest release of it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CONFIG_PARSER_MODULES",
    "DECLARED",
    "FLAG_REPLACEMENTS",
    "KV_EVENTS_MODULE",
    "KV_EVENT_FIELDS",
    "KV_EVENT_OPTIONAL",
    "ONE_OF",
    "OPTIONAL_RESOLVED_FIELDS",
    "PACKAGE_DIR",
    "REMOVED_FLAGS",
    "RESOLVED_FIELDS",
    "SGLANG_WINDOW",
    "STRING_LITERALS",
    "Use",
    "generate_keywords",
    "imported_names",
    "sampling_keys",
    "server_args_fields",
]

# (oldest, newest): the oldest runs on our GPU machines (torch 2.11), the newest is the newest on PyPI.
SGLANG_WINDOW = ("0.5.17", "0.5.23")
PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True, order=True)
class Use:
    """``module`` must exist; ``name`` (a class, function or constant) be defined at its top level;
    ``member`` be a method, class attribute or ``self.member`` assignment of that class (or its bases
    in the same check)."""

    module: str
    name: str | None = None
    member: str | None = None
    by: str = ""  # which of our modules relies on it

    def __str__(self) -> str:
        return ".".join(p for p in (self.module, self.name, self.member) if p)


_ENGINE = "sglang.srt.entrypoints.engine"
_TM = "sglang.srt.managers.tokenizer_manager"
_LOADS = "sglang.srt.managers.load_snapshot"

DECLARED: tuple[Use, ...] = (
    Use(_ENGINE, "Engine", "async_generate", by="handler"),
    Use(_ENGINE, "Engine", "tokenizer_manager", by="handler, engine"),
    Use(_ENGINE, "Engine", "shutdown", by="engine"),
    Use(_ENGINE, "Engine", "_scheduler_init_result", by="engine (KV capacity fallback)"),
    Use(_ENGINE, "SchedulerInitResult", "scheduler_infos", by="engine"),
    Use(_ENGINE, "SchedulerInitResult", "all_child_pids", by="engine (the processes it watches)"),
    Use(_TM, "TokenizerManager", "abort_request", by="handler, engine"),
    Use(_TM, "TokenizerManager", "auto_create_handle_loop", by="engine"),
    Use(_TM, "TokenizerManager", "asyncio_tasks", by="engine (released after the engine died)"),
    Use(_TM, "TokenizerManager", "bootstrap_server", by="engine (bootstrap port check)"),
    Use(_TM, "TokenizerManager", "context_len", by="engine"),
    Use(_TM, "TokenizerManager", "generate_request", by="handler (embeddings)"),
    Use(_TM, "TokenizerManager", "model_config", by="engine (embedding size in the model card)"),
    Use("sglang.srt.configs.model_config", "ModelConfig", "hidden_size", by="engine"),
    Use("sglang.srt.configs.model_config", "ModelConfig", "matryoshka_dimensions", by="engine"),
    Use("sglang.srt.configs.model_config", "ModelConfig", "is_matryoshka", by="engine"),
    *(
        Use("sglang.srt.managers.io_struct", "EmbeddingReqInput", f, by="handler")
        for f in ("input_ids", "rid", "dimensions")
    ),
    Use("sglang.srt.managers.tokenizer_control_mixin", "TokenizerControlMixin", "get_loads", by="engine"),
    Use("sglang.srt.disaggregation.common.conn", "CommonKVBootstrapServer", "thread", by="engine"),
    Use("sglang.srt.disaggregation.common.conn", "CommonKVBootstrapServer", "close", by="engine (restart)"),
    *(
        Use(_LOADS, "LoadSnapshot", f, by="engine")
        for f in (
            "dp_rank",
            "num_running_reqs",
            "num_waiting_reqs",
            "num_used_tokens",
            "max_total_num_tokens",
            "max_running_requests",
            "token_usage",
            "gen_throughput",
            "cache_hit_rate",
            "timestamp",
            "queues",
            "disaggregation",
        )
    ),
    Use(_LOADS, "QueueMetrics", "waiting", by="engine (canary diagnosis)"),
    *(
        Use(_LOADS, "DisaggregationMetrics", f, by="engine (canary diagnosis)")
        for f in (
            "prefill_bootstrap_queue_reqs",
            "prefill_inflight_queue_reqs",
            "decode_prealloc_queue_reqs",
            "decode_transfer_queue_reqs",
        )
    ),
    Use("sglang.srt.server_args", "ServerArgs", "add_cli_args", by="args"),
    Use("sglang.srt.server_args", "ServerArgs", "from_cli_args", by="args"),
)

# ``--config``: SGLang's config file merger moved in 0.5.19; args.py imports the first that exists.
CONFIG_PARSER_MODULES = ("sglang.srt.utils.server_args_config_parser", "sglang.srt.server_args_config_parser")
ONE_OF: tuple[tuple[Use, ...], ...] = (
    tuple(Use(m, "ConfigArgumentMerger", "merge_config_with_args", by="args") for m in CONFIG_PARSER_MODULES),
)

# What the worker reads of ServerArgs once the engine runs, through ``server_args.resolved_values``:
# ``resolved_dict()`` where SGLang has it (0.5.19+: the fields keep the raw command line), the
# attributes otherwise (up to 0.5.17 the fields are the resolved values). Each must be a field.
RESOLVED_FIELDS = (
    "model_path",
    "served_model_name",
    "tokenizer_path",
    "page_size",
    "dp_size",
    "enable_dp_attention",
    "disaggregation_mode",
    "disaggregation_bootstrap_port",
    "host",
    "kv_events_config",
)
# Read where the field exists: ``--attn-dp-size`` (0.5.22+; before, ``--enable-dp-attention --dp-size``).
OPTIONAL_RESOLVED_FIELDS = ("attn_dp_size",)

# Flags SGLang removed inside the window: flags of the oldest release that the newest has not (a
# test derives this set from both releases' source). Used to word the refusal of such a flag.
REMOVED_FLAGS = frozenset(
    {
        "--collect-tokens-histogram",
        "--cuda-graph-bs",
        "--cuda-graph-max-bs",
        "--cuda-graph-tc-compiler",
        "--disable-piecewise-cuda-graph",
        "--dsa-prefill-cp-mode",
        "--elastic-ep-rejoin",
        "--enable-breakable-cuda-graph",
        "--enable-dsa-prefill-context-parallel",
        "--enable-expert-distribution-metrics",
        "--enable-gdn-replayssm-spec",
        "--enable-nsa-prefill-context-parallel",
        "--enable-prefill-context-parallel",
        "--enforce-piecewise-cuda-graph",
        "--keep-mm-feature-on-device",
        "--mamba-scheduler-strategy",
        "--nsa-decode-backend",
        "--nsa-prefill-backend",
        "--nsa-prefill-cp-mode",
        "--piecewise-cuda-graph-compiler",
        "--piecewise-cuda-graph-max-tokens",
        "--piecewise-cuda-graph-tokens",
        "--prefill-cp-mode",
        "--prefill-round-robin-balance",
        "--speculative-dflash-draft-window-size",
        "--speculative-skip-dp-mlp-sync",
        "--stream-output",
        "--torchao-config",
    }
)
# Where a flag of one end of the window has a direct replacement at the other end.
FLAG_REPLACEMENTS = {
    "--cuda-graph-bs": "--cuda-graph-bs-decode and --cuda-graph-bs-prefill",
    "--cuda-graph-max-bs": "--cuda-graph-max-bs-decode and --cuda-graph-max-bs-prefill",
    "--attn-dp-size": "--dp-size N --enable-dp-attention",
    "--attention-data-parallel-size": "--dp-size N --enable-dp-attention",
}

# Dict keys and values our code reads from what SGLang returns, and the module that writes them:
# output ``meta_info`` keys (handler), finish reason ``to_json()`` types (handler), the scheduler's
# startup info (engine's capacity fallback). Each must appear as a string literal there.
STRING_LITERALS = {
    _TM: (
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "meta_info",
        "output_ids",
        "output_token_logprobs",
        "output_top_logprobs",
        "embedding",
    ),
    "sglang.srt.managers.schedule_batch": ("stop", "length", "abort", "matched", "status_code", "message"),
    "sglang.srt.managers.scheduler": ("max_total_num_tokens",),
}

# The fields kv_events.py reads of SGLang's KV event structs. Encoded as tagged arrays (up to 0.5.19)
# they are read by position, so they must come first and in this order; encoded as tagged maps
# (0.5.20+) by name. Every one but those in ``KV_EVENT_OPTIONAL`` must be on the wire.
KV_EVENT_FIELDS = {
    "EventBatch": ("ts", "events", "attn_dp_rank"),
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}
KV_EVENT_OPTIONAL = {"attn_dp_rank", "medium", "parent_block_hash", "lora_id", "block_size"}
KV_EVENTS_MODULE = "sglang.srt.disaggregation.kv_events"


# --- derived from our source ---------------------------------------------------------------------


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    def called(node: ast.Call) -> str | None:
        f = node.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None

    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and called(n) == name]


def generate_keywords(handler_path: Path = PACKAGE_DIR / "handler.py") -> set[str]:
    """The ``async_generate`` keywords the handler passes (through ``_call_kwargs``)."""
    return {kw.arg for call in _calls(_tree(handler_path), "_call_kwargs") for kw in call.keywords if kw.arg}


def sampling_keys(handler_path: Path = PACKAGE_DIR / "handler.py") -> set[str]:
    """The sampling parameter keys the handler sends."""
    tree = _tree(handler_path)
    dicts: list[ast.Dict] = []
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == "sampling_params":
            dicts += [
                r.value for r in ast.walk(fn) if isinstance(r, ast.Return) and isinstance(r.value, ast.Dict)
            ]
    for call in _calls(tree, "_call_kwargs"):
        dicts += [
            kw.value for kw in call.keywords if kw.arg == "sampling_params" and isinstance(kw.value, ast.Dict)
        ]
    return {
        k.value for d in dicts for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
    }


def _is_server_args(node: ast.AST, extra_names: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "server_args" or node.id in extra_names
    return isinstance(node, ast.Attribute) and node.attr == "server_args"


def server_args_fields(package_dir: Path = PACKAGE_DIR) -> set[str]:
    """``ServerArgs`` fields this package reads or sets (see the module docstring for the rules)."""
    fields: set[str] = set()
    for path in sorted(package_dir.glob("*.py")):
        extra = {"ns"} if path.name == "args.py" else set()
        for node in ast.walk(_tree(path)):
            fields |= _fields_used(node, extra)
    return fields - {"model_fields", "resolved_dict"}  # resolved_dict: read where it exists (resolved.py)


def _fields_used(node: ast.AST, extra_names: set[str]) -> set[str]:
    """The fields one node reads or sets: ``server_args.FIELD``, ``getattr(server_args, "FIELD")``, or
    ``values["FIELD"]`` inside ``contract_overrides``."""
    if isinstance(node, ast.Attribute) and _is_server_args(node.value, extra_names):
        return {node.attr}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
        return _getattr_field(node, extra_names)
    if isinstance(node, ast.FunctionDef) and node.name == "contract_overrides":
        return {key for sub in ast.walk(node) if (key := _values_key(sub)) is not None}
    return set()


def _getattr_field(call: ast.Call, extra_names: set[str]) -> set[str]:
    if len(call.args) < 2 or not _is_server_args(call.args[0], extra_names):
        return set()
    key = call.args[1]
    return {key.value} if isinstance(key, ast.Constant) and isinstance(key.value, str) else set()


def _values_key(node: ast.AST) -> str | None:
    """``FIELD`` of ``values["FIELD"]``."""
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == "values"
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
    ):
        return node.slice.value
    return None


def imported_names(package_dir: Path = PACKAGE_DIR) -> set[Use]:
    """Every SGLang module (and name imported from it) in this package's source."""
    uses: set[Use] = set()
    for path in sorted(package_dir.glob("*.py")):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "sglang":
                uses.update(Use(node.module, a.name, by=path.stem) for a in node.names)
            elif isinstance(node, ast.Import):
                uses.update(Use(a.name, by=path.stem) for a in node.names if a.name.split(".")[0] == "sglang")
    return uses
