"""Building a model card from a model folder (pure file reads): which files it carries, eos ids and
context length from the HF config files, a checksum that changes exactly when the content does, and a
clear error for a folder without a tokenizer."""

from __future__ import annotations

import json
import shutil

import pytest
from dynamo_worker.runtime.modelcard import ModelCard, ModelCardError, build_model_card
from dynamo_worker.tinymodel import ensure_tiny_model


@pytest.fixture
def model_dir(tmp_path):
    src = ensure_tiny_model(tmp_path / "src")
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    return dst


def test_card_describes_the_tiny_model(model_dir):
    card = build_model_card(model_dir, "tiny", page_size=16)
    assert card.name == "tiny" and card.page_size == 16
    assert card.context_length == 4096  # max_position_embeddings
    assert card.eos_token_ids == [2, 0]  # generation_config.json
    assert set(card.files) == {
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "config.json",
    }
    assert card.checksum == card.content_checksum() and len(card.checksum) == 64


def test_checksum_follows_content(model_dir):
    a = build_model_card(model_dir, "tiny")
    assert build_model_card(model_dir, "tiny").checksum == a.checksum
    assert build_model_card(model_dir, "other").checksum != a.checksum
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    assert build_model_card(model_dir, "tiny").checksum != a.checksum


def test_eos_falls_back_to_config_then_tokenizer_config(model_dir):
    (model_dir / "generation_config.json").unlink()
    assert build_model_card(model_dir, "t").eos_token_ids == [2]  # config.json eos_token_id
    config = json.loads((model_dir / "config.json").read_text())
    del config["eos_token_id"]
    (model_dir / "config.json").write_text(json.dumps(config))
    assert build_model_card(model_dir, "t").eos_token_ids == [2]  # "<|im_end|>" looked up in tokenizer.json


def test_explicit_context_length_wins(model_dir):
    assert build_model_card(model_dir, "t", context_length=128).context_length == 128


def test_a_folder_without_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(ModelCardError, match=r"no tokenizer.json.*--model-path"):
        build_model_card(tmp_path, "t")


def test_a_newer_workers_card_loads_without_the_fields_this_frontend_does_not_know():
    """Rolling upgrade: a card published by a later release (a new field, also inside ``features``)."""
    card = ModelCard(name="m", page_size=16, eos_token_ids=[2])
    body = card.model_dump(mode="json")
    body["later_field"] = {"x": 1}
    body["features"]["later_feature"] = True
    assert ModelCard.model_validate_json(json.dumps(body)) == card
