"""The tiny model folder: created quickly and deterministically, a byte-level BPE tokenizer that
round-trips any UTF-8 text, a chat template, and eos ids that agree across its files."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
from dynamo_worker.tinymodel import ensure_tiny_model, main
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

_TOKENIZER: Tokenizer | None = None


def _tokenizer(tmp: Path) -> Tokenizer:
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = Tokenizer.from_file(str(ensure_tiny_model(tmp / "m") / "tokenizer.json"))
    return _TOKENIZER


def test_creation_is_deterministic_and_reused(tmp_path):
    a = ensure_tiny_model(tmp_path / "a")
    b = ensure_tiny_model(tmp_path / "b")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    mtime = (a / "tokenizer.json").stat().st_mtime_ns
    assert ensure_tiny_model(a) == a
    assert (a / "tokenizer.json").stat().st_mtime_ns == mtime


def test_an_incomplete_folder_is_replaced(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    path = ensure_tiny_model(tmp_path / "m")
    assert (path / "tokenizer.json").is_file()


def test_files_agree_on_eos_and_config(tmp_path):
    path = ensure_tiny_model(tmp_path / "m")
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    config = json.loads((path / "config.json").read_text())
    gen = json.loads((path / "generation_config.json").read_text())
    tcfg = json.loads((path / "tokenizer_config.json").read_text())
    assert config["architectures"] and config["max_position_embeddings"] >= 2048
    assert config["vocab_size"] == tok.get_vocab_size()
    assert tok.token_to_id(tcfg["eos_token"]) == gen["eos_token_id"][0]


def test_chat_template_renders_chatml(tmp_path):
    path = ensure_tiny_model(tmp_path / "m")
    template = json.loads((path / "tokenizer_config.json").read_text())["chat_template"]
    text = (
        jinja2.Environment()
        .from_string(template)
        .render(messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    )
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids = Tokenizer.from_file(str(path / "tokenizer.json")).encode(text).ids
    assert ids[0] == 1 and 2 in ids  # <|im_start|>, <|im_end|> are single special tokens


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_any_utf8_text_roundtrips(tmp_path_factory, text):
    tok = _tokenizer(tmp_path_factory.mktemp("tok"))
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


def test_command_line_creates_the_folder(tmp_path, capsys):
    assert main([str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / "tokenizer.json").is_file()
    assert str(tmp_path / "cli") in capsys.readouterr().out
