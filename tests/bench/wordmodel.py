"""A model folder with a word-level tokenizer for side-by-side benchmarks (``tests.bench.peers``).

Every id of its ~160k vocabulary decodes to one whole word (letters only), so any id a simulated
engine emits (NVIDIA Dynamo's mocker draws ids in the low thousands, ours draws from the word ids)
streams as exactly one chunk of visible text, and both frontends do the same detokenizing work per
token. The vocabulary starts with the load generator's prompt words, so prompts tokenize one word to
one token. ``config.json`` carries ``architectures`` (Dynamo's mocker requires it).
"""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

from dynamo_worker.bench.workload import WORDS
from tokenizers import Tokenizer, models, pre_tokenizers

__all__ = ["VOCAB_SIZE", "ensure_word_model", "vocabulary"]

VOCAB_SIZE = 160_000
VERSION = 1
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _words(n: int) -> list[str]:
    """The prompt words, then made-up words of three consonant-vowel syllables, ``n`` in all."""
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]  # 90
    made = ("".join(p) for p in itertools.product(syllables, repeat=3))
    seen = dict.fromkeys(WORDS)
    for w in made:
        if len(seen) >= n:
            break
        seen.setdefault(w)
    return list(seen)


@functools.cache
def vocabulary() -> tuple[str, ...]:
    """Every token of the model by id: the special tokens, then one word each."""
    return (*SPECIAL, *_words(VOCAB_SIZE - len(SPECIAL)))


def _write(folder: Path) -> None:
    vocab = {t: i for i, t in enumerate(vocabulary())}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(SPECIAL)
    tokenizer.save(str(folder / "tokenizer.json"))
    dump = lambda name, data: (folder / name).write_text(json.dumps(data, indent=1) + "\n")  # noqa: E731
    dump(
        "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": SPECIAL[0],
            "eos_token": SPECIAL[2],
            "pad_token": SPECIAL[0],
            "add_bos_token": False,
            "model_max_length": 8192,
            "chat_template": _CHAT_TEMPLATE,
        },
    )
    dump("generation_config.json", {"bos_token_id": 0, "eos_token_id": [2, 0]})
    dump(
        "config.json",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": len(vocab),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "max_position_embeddings": 8192,
            "bos_token_id": 0,
            "eos_token_id": 2,
            "torch_dtype": "bfloat16",
            "word_model_version": VERSION,
        },
    )


def ensure_word_model(folder: Path) -> Path:
    """The word-level model folder at ``folder``, written when missing or outdated."""
    try:
        if json.loads((folder / "config.json").read_text()).get("word_model_version") == VERSION:
            return folder
    except (OSError, ValueError):
        pass
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder)
    return folder
