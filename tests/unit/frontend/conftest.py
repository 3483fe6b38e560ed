"""The small BPE tokenizer of tests/support/bpe_model.py, and a model folder holding it."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from tests.support.bpe_model import build_tokenizer, write_model_dir


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return build_tokenizer()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, tokenizer) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("model"), tokenizer)
