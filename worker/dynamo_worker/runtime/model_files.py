"""What a model's own files say about it, read from its folder or the Hugging Face cache (never fetched).

A model is an **embedding model** when its sentence-transformers configuration (``modules.json``) pools
the transformer's output with a ``sentence_transformers.models.Pooling`` module: that is how a model on the
hub says it produces vectors, also when its ``config.json`` names a causal-LM architecture, as
Qwen3-Embedding's does (``Qwen3ForCausalLM``, which SGLang alone would serve as a text generator). The
flags that say so outright are honoured as well: SGLang's ``--is-embedding`` and NVIDIA Dynamo's
``--embedding-worker``. The files are read where they already are (a model folder, the node's Hugging
Face cache): a worker decides before its engine downloads anything.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

__all__ = ["POOLING_MODULE", "is_embedding_model", "model_file"]

log = logging.getLogger(__name__)

POOLING_MODULE = "sentence_transformers.models.Pooling"


def model_file(model: str | Path | None, name: str) -> Path | None:
    """File ``name`` of ``model``: a folder, or a hub id already in the local Hugging Face cache (never
    fetched: a worker decides before its engine downloads anything). None when not there."""
    if not model:
        return None
    folder = Path(model)
    if folder.is_dir():
        path = folder / name
        return path if path.is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(str(model), name)
    except ValueError:  # not a hub id
        return None
    return Path(found) if isinstance(found, str) else None


def is_embedding_model(*models: str | Path | None) -> bool:
    """Whether the first of ``models`` (folders or cached hub ids) that has sentence-transformers modules
    pools its output into one vector."""
    path = next((p for p in (model_file(m, "modules.json") for m in models) if p), None)
    if path is None:
        return False
    try:
        modules = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.warning("Could not read %s (%s); serving the model as a text generator", path, exc)
        return False
    return isinstance(modules, list) and any(
        isinstance(m, dict) and m.get("type") == POOLING_MODULE for m in modules
    )
