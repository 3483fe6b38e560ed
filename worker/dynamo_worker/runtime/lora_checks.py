"""What is checked of a LoRA adapter before an engine loads it: its source, its PEFT folder, its fit. Pure.

More: docs/module-notes.md (dynamo_worker.runtime.lora_checks)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import unquote, urlsplit

from dynamo_api.errors import DynamoError

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "DUMMY_WEIGHTS_LOG",
    "REASONS",
    "AdapterConfig",
    "LoraError",
    "LoraLimits",
    "Source",
    "StartupAdapter",
    "check_fits",
    "dummy_weights_block",
    "effective_limits",
    "normalize_targets",
    "parse_adapter_config",
    "parse_lora_paths",
    "parse_source",
    "read_adapter_config",
    "same_source",
    "source_of_path",
]

ADAPTER_CONFIG: Final = "adapter_config.json"
ADAPTER_WEIGHTS: Final = ("adapter_model.safetensors", "adapter_model.bin")
ALL_TARGETS: Final = frozenset({"all"})
# SGLang reads an adapter's weights with the engine's own load config (``LoRAAdapter.initialize_weights``
# builds a ``DefaultModelLoader`` from it, 0.5.17 to 0.5.23); under ``dummy`` that loader reads no file.
DUMMY_WEIGHTS_LORA: Final = (
    "SGLang reads a LoRA adapter's weights with the model's --load-format, and --load-format dummy reads "
    "no files (SGLang's own server fails alike: 'DUMMY load_format should use DummyModelLoader'), so no "
    "adapter can be loaded; serve real weights with --load-format auto (or another format that reads "
    "files), or run without --enable-lora and --lora-paths"
)
# What a worker logs (an error, once, at start) when it runs so; %s: DUMMY_WEIGHTS_LORA.
DUMMY_WEIGHTS_LOG: Final = (
    "This worker runs with LoRA and --load-format dummy: it can load no LoRA adapter (POST /v1/loras "
    "answers LoraNotSupported; the base model serves). %s"
)

REASONS: Final = {
    "InvalidRequest": 400,
    "LoraNotEnabled": 400,
    "LoraNotSupported": 400,
    "InvalidSource": 400,
    "SourceUnreachable": 503,
    "RankTooLarge": 400,
    "IncompatibleAdapter": 400,
    "NameConflict": 409,
    "NoFreeSlot": 409,
    "NotFound": 404,
    "NotReady": 503,
    "LoadFailed": 500,
}

# SGLang's normalization of PEFT target module names (sglang.srt.lora.utils), for the common ones.
_NORMALIZED = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
    "vocab_emb": "embed_tokens",
    "embeddings": "embed_tokens",
    "word_embeddings": "embed_tokens",
    "output": "lm_head",
    "unembed_tokens": "lm_head",
    "q_a_proj": "fused_qkv_a_proj_with_mqa",
    "kv_a_proj_with_mqa": "fused_qkv_a_proj_with_mqa",
}


class LoraError(DynamoError):
    """A load or unload that cannot be done: ``reason`` (one of ``REASONS``) and the message."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown LoRA error reason {reason!r}")
        super().__init__(message)
        self.reason = reason
        self.message = message

    @property
    def status(self) -> int:
        return REASONS[self.reason]

    def body(self) -> dict[str, str]:
        return {"status": "error", "reason": self.reason, "message": self.message}


# --- sources ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where an adapter comes from: a local folder, or a Hugging Face repository at a revision."""

    scheme: Literal["file", "hf"]
    location: str  # the absolute folder path, or org/repo
    revision: str | None = None

    @property
    def uri(self) -> str:
        if self.scheme == "file":
            return f"file://{self.location}"
        return f"hf://{self.location}" + (f"@{self.revision}" if self.revision else "")


def parse_source(uri: str) -> Source:
    """The ``Source`` a uri names; ``LoraError(InvalidSource)`` for anything else."""
    uri = uri.strip()
    if uri.startswith("/"):
        uri = "file://" + uri
    parts = urlsplit(uri)
    if parts.scheme == "file":
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost") or not path.startswith("/"):
            raise LoraError(
                "InvalidSource",
                f"{uri!r} is not a local folder uri; write file:///absolute/path/to/adapter (three slashes)",
            )
        return Source("file", str(Path(path)))
    if parts.scheme == "hf":
        repo, _, revision = (parts.netloc + parts.path).strip("/").partition("@")
        if repo.count("/") != 1 or not all(repo.split("/")):
            raise LoraError(
                "InvalidSource", f"{uri!r} does not name a Hugging Face repository; write hf://org/repo[@rev]"
            )
        return Source("hf", repo, revision or None)
    if parts.scheme == "s3":
        raise LoraError(
            "InvalidSource",
            f"{uri!r}: s3:// sources are not supported by this worker; copy the adapter folder to a volume "
            "the worker pods mount (or a Hugging Face repository) and load it with file:///<path> (or hf://)",
        )
    raise LoraError(
        "InvalidSource",
        f"{uri!r} has an unsupported scheme; use file:///abs/path or hf://org/repo[@rev]",
    )


def same_source(a: str, b: str) -> bool:
    """Whether two uris name the same adapter (``file:///p`` and ``/p`` alike; a trailing ``/`` aside)."""
    try:
        return parse_source(a) == parse_source(b)
    except LoraError:
        return a == b


def source_of_path(path: str) -> str:
    """The uri of an adapter given as a path to SGLang (``--lora-paths``): a local folder, else a hub id."""
    if Path(path).is_absolute() or Path(path).exists():
        return f"file://{Path(path).resolve()}"
    return f"hf://{path}"


# --- the adapter's folder ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AdapterConfig:
    """What matters of a PEFT adapter's ``adapter_config.json``: its rank and (normalized) targets."""

    rank: int
    target_modules: frozenset[str]
    use_dora: bool = False


def normalize_targets(targets: str | Iterable[str]) -> frozenset[str]:
    """Target module names as SGLang compares them; ``all`` (``{"all"}``) fits any engine."""
    if isinstance(targets, str):
        if targets in ("all", "all-linear"):
            return ALL_TARGETS
        targets = [targets]
    out = set()
    for name in targets:
        base = name.split(".")[-1]
        out.add(_NORMALIZED.get(base, base))
    return frozenset(out)


def parse_adapter_config(data: Any, where: str) -> AdapterConfig:
    """``AdapterConfig`` of a decoded ``adapter_config.json``; ``LoraError(InvalidSource)`` naming what
    is missing."""
    if not isinstance(data, Mapping):
        raise LoraError(
            "InvalidSource", f"{where}: {ADAPTER_CONFIG} is not a JSON object; write PEFT's format"
        )
    peft_type = str(data.get("peft_type") or "LORA").upper()
    if peft_type != "LORA":
        raise LoraError(
            "InvalidSource", f"{where} is a {peft_type} adapter; only LoRA adapters (peft_type LORA) load"
        )
    rank = data.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise LoraError(
            "InvalidSource", f"{where}: {ADAPTER_CONFIG} has no positive integer rank 'r' (got {rank!r})"
        )
    targets = data.get("target_modules")
    if not (
        isinstance(targets, str)
        or (isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets))
    ):
        raise LoraError(
            "InvalidSource",
            f"{where}: {ADAPTER_CONFIG} has no 'target_modules' (a list of module names, or 'all-linear')",
        )
    alpha = data.get("lora_alpha")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise LoraError(
            "InvalidSource", f"{where}: {ADAPTER_CONFIG} has no number 'lora_alpha' (got {alpha!r})"
        )
    return AdapterConfig(
        rank=rank, target_modules=normalize_targets(targets), use_dora=bool(data.get("use_dora"))
    )


def read_adapter_config(folder: Path) -> AdapterConfig:
    """The folder's adapter config, checked; ``LoraError(InvalidSource)`` when it is no PEFT LoRA adapter.
    Reads files: call it off the event loop."""
    if not folder.is_dir():
        raise LoraError(
            "InvalidSource",
            f"{folder} is not a folder on this worker; mount the volume holding the adapter on every worker "
            "pod (prefill and decode alike) and give its path",
        )
    config = folder / ADAPTER_CONFIG
    if not config.is_file():
        raise LoraError(
            "InvalidSource",
            f"{folder} has no {ADAPTER_CONFIG}, so it is not a PEFT adapter; save the adapter with PEFT's "
            "save_pretrained (adapter_config.json and adapter_model.safetensors)",
        )
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise LoraError("InvalidSource", f"{config} cannot be read as JSON ({e})") from None
    parsed = parse_adapter_config(data, str(folder))
    if not any((folder / name).is_file() for name in ADAPTER_WEIGHTS):
        raise LoraError(
            "InvalidSource",
            f"{folder} has {ADAPTER_CONFIG} but no weights ({' or '.join(ADAPTER_WEIGHTS)}); copy them too",
        )
    return parsed


# --- the engine's limits ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoraLimits:
    """What a LoRA-enabled engine accepts (SGLang's flags). ``None``: not given (see
    ``effective_limits``); ``target_modules`` ``{"all"}``: every module SGLang supports.
    ``cannot_load``: why the engine can load no adapter at all, with the fix (None: it can)."""

    max_loras_per_batch: int = 8
    max_loaded_loras: int | None = None
    max_lora_rank: int | None = None
    target_modules: frozenset[str] | None = None
    cannot_load: str | None = None


def dummy_weights_block(lora_enabled: bool, load_format: str | None) -> str | None:
    """Why an engine with LoRA on can load no adapter at all, with the fix (``DUMMY_WEIGHTS_LORA``);
    None when LoRA is off or its weights are read from files."""
    return DUMMY_WEIGHTS_LORA if lora_enabled and str(load_format) == "dummy" else None


def effective_limits(limits: LoraLimits, startup: Sequence[AdapterConfig]) -> LoraLimits:
    """The limits an engine runs with: the flags, else what SGLang infers from its startup adapters."""
    rank = limits.max_lora_rank
    if rank is None and startup:
        rank = max(c.rank for c in startup)
    targets = limits.target_modules
    if targets is None and startup:
        targets = frozenset().union(*(c.target_modules for c in startup))
    return replace(limits, max_lora_rank=rank, target_modules=targets)


def check_fits(name: str, config: AdapterConfig, limits: LoraLimits) -> None:
    """Raise ``LoraError`` (``RankTooLarge``, ``IncompatibleAdapter``) when the engine cannot take it."""
    if config.use_dora:
        raise LoraError(
            "IncompatibleAdapter", f"adapter {name!r} is a DoRA adapter, which SGLang does not serve"
        )
    if limits.max_lora_rank is not None and config.rank > limits.max_lora_rank:
        raise LoraError(
            "RankTooLarge",
            f"adapter {name!r} has rank {config.rank}, above this worker's --max-lora-rank "
            f"{limits.max_lora_rank}; restart the workers with --max-lora-rank {config.rank} (or more)",
        )
    allowed = limits.target_modules
    if allowed is None or "all" in allowed or "all" in config.target_modules:
        return
    outside = sorted(config.target_modules - allowed)
    if outside:
        raise LoraError(
            "IncompatibleAdapter",
            f"adapter {name!r} targets {', '.join(outside)}, outside this worker's --lora-target-modules "
            f"({', '.join(sorted(allowed))}); restart the workers with --lora-target-modules listing them "
            "(or 'all')",
        )


# --- SGLang's --lora-paths ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StartupAdapter:
    """An adapter an engine loads at start (``--lora-paths``)."""

    name: str
    path: str
    pinned: bool = False


def _one_lora_path(item: Any) -> StartupAdapter:
    if isinstance(item, Mapping):
        return StartupAdapter(str(item["lora_name"]), str(item["lora_path"]), bool(item.get("pinned")))
    if hasattr(item, "lora_name") and hasattr(item, "lora_path"):  # SGLang's LoRARef
        return StartupAdapter(str(item.lora_name), str(item.lora_path), bool(getattr(item, "pinned", False)))
    text = str(item).strip()
    if text.startswith("{") and text.endswith("}"):
        return _one_lora_path(json.loads(text))
    name, sep, path = text.partition("=")
    return StartupAdapter(name, path) if sep else StartupAdapter(text, text)


def parse_lora_paths(value: Any) -> list[StartupAdapter]:
    """SGLang's ``--lora-paths`` in any form it takes (``PATH``, ``NAME=PATH``, JSON objects with
    ``lora_name``, ``lora_path`` and ``pinned``; a dict of name to path; its parsed ``LoRARef``s).
    Raises ``ValueError`` naming an entry it cannot read."""
    if not value:
        return []
    if isinstance(value, Mapping):
        return [StartupAdapter(str(k), str(v)) for k, v in value.items()]
    items = [value] if isinstance(value, str) else list(value)
    out = []
    for item in items:
        try:
            out.append(_one_lora_path(item))
        except (KeyError, ValueError) as e:
            raise ValueError(
                f"--lora-paths entry {item!r} is not PATH, NAME=PATH or "
                f'{{"lora_name": ..., "lora_path": ..., "pinned": ...}} ({e})'
            ) from None
    return out
