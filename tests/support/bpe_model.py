"""A small byte-level BPE tokenizer trained in-process (no downloads), and a model folder holding it with a
chat template: what the frontend's preprocessor reads, for the frontend's unit and integration tests."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = [
    "Hello world, this is a tiny corpus for a tiny tokenizer.",
    "The quick brown fox jumps over the lazy dog.",
    "Stop strings must never leak into the output text.",
    "caf\u00e9 na\u00efve \u00fcber stra\u00dfe",
] * 20

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles must be system, user or assistant') }}{% endif %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def write_model_dir(d: Path, tokenizer: Tokenizer) -> Path:
    """``d`` as a model folder: the tokenizer, its config with the chat template, and the eos token id."""
    tokenizer.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHAT_TEMPLATE, "bos_token": "<s>", "eos_token": {"content": "</s>"}})
    )
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}))
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    return d
