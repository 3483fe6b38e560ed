"""The mocker's model folder (``resolve_model_dir``: the tokenizer's, else the tiny model), what its
config.json tells (the KV bytes per token, ``serving_features``), and the host tier those bytes size
(``size_host_tier``)."""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dynamo_worker.mocker.kv_manager import BlockManager
from dynamo_worker.mocker.settings import MockerSettings
from dynamo_worker.mocker.timing import TimingModel
from dynamo_worker.protocol import ServingFeatures
from dynamo_worker.tinymodel import ensure_tiny_model

__all__ = ["TINY_MODEL_DIR", "resolve_model_dir", "serving_features", "size_host_tier"]

log = logging.getLogger(__name__)

TINY_MODEL_DIR = "dynamo-tiny-model"


def _read_config(model_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _kv_bytes_from_config(config: dict[str, Any]) -> int | None:
    """2 (K and V) x layers x kv heads x head dim x 2 bytes (bf16), when config.json tells."""
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
        head_dim = int(
            config.get("head_dim") or int(config["hidden_size"]) // int(config["num_attention_heads"])
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return 2 * layers * heads * head_dim * 2


def resolve_model_dir(settings: MockerSettings) -> Path:
    """The folder with the tokenizer: --model-dir, else --model-path / --tokenizer-path when they are
    folders, else the tiny model (created in the temp dir)."""
    for candidate in (settings.model_dir, settings.model_path, settings.tokenizer_path):
        if candidate is not None and Path(candidate).is_dir():
            return Path(candidate)
    if settings.model_dir is not None:
        raise FileNotFoundError(
            f"--model-dir {settings.model_dir} is not a folder; create it or drop the flag"
        )
    path = ensure_tiny_model(Path(tempfile.gettempdir()) / TINY_MODEL_DIR)
    log.info("Using the tiny model folder path=%s (no model folder given)", path)
    return path


def serving_features(settings: MockerSettings, config: dict[str, Any], embedding_dim: int) -> ServingFeatures:
    """What the worker's model card says it serves, from its flags and config.json."""
    s = settings
    matryoshka = config.get("matryoshka_dimensions")
    return ServingFeatures(
        model_type="embedding" if s.is_embedding else "generate",
        tool_call_parser=s.tool_call_parser,
        reasoning_parser=s.reasoning_parser,
        # as SGLang: no grammars without its tokenizer (--skip-tokenizer-init)
        grammar_backend="none" if s.skip_tokenizer_init else s.grammar_backend,
        embedding_dim=embedding_dim if s.is_embedding else None,
        is_matryoshka=bool(config.get("is_matryoshka") or matryoshka),
        matryoshka_dimensions=matryoshka if isinstance(matryoshka, list) else None,
    )


def size_host_tier(
    kvs: Sequence[BlockManager], settings: MockerSettings, kv_bytes: int, timing: TimingModel
) -> None:
    """HiCache's host memory of each rank's cache in ``kvs``, now that the KV bytes per token are known
    (--hicache-size)."""
    s = settings
    host = s.host_blocks(kv_bytes)
    for kv in kvs:
        kv.host_blocks = host
    if not host:
        return
    log.info(
        "Simulating HiCache host_kv_blocks=%d (%.1f GB) write_policy=write_through "
        "load_back_us_per_block=%.0f",
        host,
        host * s.page_size * kv_bytes / 1e9,
        timing.load_back_s(s.page_size) * 1e6,
    )
    if host <= s.gpu_blocks:
        log.warning(
            "HiCache host KV cache (%d blocks) is not larger than the GPU's (%d blocks): host memory "
            "holds copies of the GPU's blocks first, so few evicted blocks stay there; raise "
            "--hicache-ratio above 1 (SGLang warns alike)",
            host,
            s.gpu_blocks,
        )
