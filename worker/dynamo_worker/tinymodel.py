"""A tiny model folder for tests, examples and the mocker: created on demand, deterministic, < 1 s.

``ensure_tiny_model(path)`` writes (once; later calls reuse it):

- ``tokenizer.json``: a byte-level BPE tokenizer trained with ``tokenizers`` on the corpus embedded
  below (vocab ``VOCAB_SIZE``), so any UTF-8 text round-trips through encode/decode;
- ``tokenizer_config.json``: ChatML ``chat_template``, ``bos_token``/``eos_token``/``pad_token``;
- ``generation_config.json``: ``eos_token_id`` (``<|im_end|>`` and ``<|endoftext|>``);
- ``config.json``: a small Llama-shaped config (``architectures``, ``max_position_embeddings``,
  layer/head sizes the mocker uses to size the KV cache per token).

``python -m dynamo_worker.tinymodel DIR`` creates it from the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = ["MODEL_NAME", "SPECIAL_TOKENS", "VOCAB_SIZE", "ensure_tiny_model", "main"]

MODEL_NAME = "dynamo-tiny"
VERSION = 1
VOCAB_SIZE = 1024
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
BOS, EOS = "<|endoftext|>", "<|im_end|>"

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

CORPUS = """
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Large language models read tokens and write tokens. The prefill phase reads the whole prompt at once;
the decode phase writes one token at a time. A key value cache keeps what attention has computed, so
the model does not compute it twice. Blocks of the cache are shared between requests with the same
prefix. When memory runs out, the least recently used blocks are evicted first.
In a disaggregated deployment, one worker computes the prefill and another worker decodes. The prefill
worker sends the cache to the decode worker over the network, and the decode worker streams the answer.
The frontend speaks the OpenAI API: chat completions, completions and models. It tokenizes the prompt,
applies the chat template, picks a worker, and detokenizes what comes back. Hello, world! How are you
today? I am fine, thank you. What is the capital of France? Paris is the capital of France. Tell me a
story about a robot who learns to paint. Once upon a time, there was a small robot named Ada. She
painted the sky blue, the grass green and the sun yellow. Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 100
1000 3.14 2.71. Punctuation: ( ) [ ] { } < > , . ; : ! ? ' " - _ / \\ | @ # $ % ^ & * + = ~ `.
def main(): return 0  # code has words, symbols and indentation too
Kubernetes runs pods on nodes. An operator watches custom resources and makes the world match them.
Bonjour le monde. Hallo Welt. Hola mundo. Ciao mondo. こんにちは世界。 你好世界。 Привет, мир.
"""


def _train_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [line for line in CORPUS.splitlines() if line.strip()]
    tokenizer.train_from_iterator(lines * 4, trainer=trainer)
    return tokenizer


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def _write_model(folder: Path) -> None:
    tokenizer = _train_tokenizer()
    tokenizer.save(str(folder / "tokenizer.json"))
    vocab_size = tokenizer.get_vocab_size()
    bos_id, eos_id = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    _write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": BOS,
            "add_bos_token": False,
            "model_max_length": 4096,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write_json(
        folder / "generation_config.json",
        {"bos_token_id": bos_id, "eos_token_id": [eos_id, bos_id], "max_new_tokens": 256},
    )
    _write_json(
        folder / "config.json",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": vocab_size,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "max_position_embeddings": 4096,
            "bos_token_id": bos_id,
            "eos_token_id": eos_id,
            "torch_dtype": "bfloat16",
            "dynamo_tiny_model_version": VERSION,
        },
    )


def _is_complete(path: Path) -> bool:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return config.get("dynamo_tiny_model_version") == VERSION and (path / "tokenizer.json").is_file()


def ensure_tiny_model(path: str | os.PathLike[str]) -> Path:
    """The tiny model folder at ``path``, created if missing or outdated (atomically, so concurrent
    callers are safe). Returns the path."""
    path = Path(path)
    if _is_complete(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    tmp.chmod(0o755)
    try:
        _write_model(tmp)
        if path.exists() and not _is_complete(path):
            shutil.rmtree(path)
        try:
            os.rename(tmp, path)
        except OSError:
            if not _is_complete(path):  # not a concurrent creator that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dynamo_worker.tinymodel",
        description="Create the tiny test model folder (tokenizer, chat template, config) in DIR.",
    )
    parser.add_argument("dir", help="folder to create (reused when it already holds the tiny model)")
    args = parser.parse_args(argv)
    print(ensure_tiny_model(args.dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
