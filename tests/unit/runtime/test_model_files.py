"""How a worker decides it serves an embedding model: a model folder whose sentence-transformers modules
pool the transformer's output (Qwen3-Embedding's, though its config.json names a causal LM) is one; a
folder without them, or whose modules do not pool, is not; NVIDIA Dynamo's --embedding-worker and
SGLang's --is-embedding say so outright: the mocker and the SGLang worker both serve embeddings then."""

from __future__ import annotations

import json
from pathlib import Path

from dynamo_worker.mocker.settings import parse_all
from dynamo_worker.runtime.model_files import is_embedding_model

# Qwen/Qwen3-Embedding-0.6B's modules.json: Transformer -> Pooling (last token) -> Normalize
QWEN3_EMBEDDING_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


def _model(tmp_path: Path, modules: list | None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    if modules is not None:
        (folder / "modules.json").write_text(json.dumps(modules))
    return folder


def test_pooling_modules_make_an_embedding_model(tmp_path: Path):
    assert is_embedding_model(_model(tmp_path, QWEN3_EMBEDDING_MODULES))


def test_no_modules_or_no_pooling_is_a_text_model(tmp_path: Path):
    assert not is_embedding_model(_model(tmp_path, None))
    assert not is_embedding_model(None, "no/such-model-in-the-cache", str(tmp_path / "missing"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "modules.json").write_text(json.dumps(QWEN3_EMBEDDING_MODULES[:1]))
    assert not is_embedding_model(tmp_path / "other")


def test_the_mocker_serves_embeddings_for_such_a_model_or_when_told(tmp_path: Path):
    folder = _model(tmp_path, QWEN3_EMBEDDING_MODULES)
    _, mocker, _, _ = parse_all(["--model-path", "Qwen/Qwen3-Embedding-0.6B", "--model-dir", str(folder)], {})
    assert mocker.is_embedding
    _, mocker, _, _ = parse_all(["--model-path", "Qwen/Qwen3-0.6B"], {})
    assert not mocker.is_embedding
    _, mocker, _, _ = parse_all(["--model-path", "Qwen/Qwen3-0.6B", "--embedding-worker"], {})
    assert mocker.is_embedding
