"""A Llama model folder with real random weights in safetensors, for GPU proofs that need an engine to
read weight files (SGLang loads a LoRA adapter with the model's ``--load-format``, and ``dummy`` reads no
files, so an adapter cannot be loaded under dummy weights; issue 36).

``write_random_llama(folder, config, seed)`` writes ``folder/config.json`` (``config`` as given) and
``folder/model.safetensors``: every tensor SGLang's and transformers' ``LlamaForCausalLM`` read, named
as Hugging Face saves them (``model.embed_tokens.weight``, ``model.layers.{i}.self_attn.q_proj.weight``,
..., ``model.norm.weight``, ``lm_head.weight``; ``tie_word_embeddings`` must be false), in bfloat16: the
RMSNorm weights 1.0, every other weight of magnitude 2**-7 to 2**-5 with random signs (about the 0.02
std of a freshly initialised Llama), from ``seed``, so the outputs are finite, deterministic and depend
on every layer (tensors are pieces of 4M values drawn once, at random offsets, so that an 8B shape is
written in seconds). Only the standard library (``peft_adapters.write_bf16_safetensors``), so the mocker path
of a proof writes the same files here without torch. The tokenizer is the caller's.

``llama_config(...)`` is a Llama ``config.json`` of the given shape; ``weight_shapes(config)`` the
tensors it needs.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.support.peft_adapters import module_shapes, random_bf16, write_bf16_safetensors

__all__ = ["WEIGHTS", "llama_config", "parameter_count", "weight_shapes", "write_random_llama"]

WEIGHTS = "model.safetensors"
_ONE_BF16 = b"\x80\x3f"  # 1.0 in bfloat16, little-endian
_POOL = 1 << 22  # random values drawn once per file; tensors are made of pieces of them (_from_pool)


def llama_config(
    *,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    context: int = 8192,
    bos: int = 1,
    eos: int = 2,
) -> dict[str, Any]:
    """A ``LlamaForCausalLM`` config.json of this shape (bfloat16, untied embeddings)."""
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden {hidden} must divide by heads {heads}, and heads by kv_heads {kv_heads}")
    if not (0 <= bos < vocab and 0 <= eos < vocab):
        raise ValueError(f"bos {bos} and eos {eos} must be token ids below vocab {vocab}")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "vocab_size": vocab,
        "max_position_embeddings": context,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "torch_dtype": "bfloat16",
        "bos_token_id": bos,
        "eos_token_id": eos,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
    }


def weight_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every weight of a Llama ``config``, by its Hugging Face name: (out, in) for a projection."""
    if config.get("tie_word_embeddings"):
        raise ValueError("tie_word_embeddings must be false: lm_head.weight is written on its own")
    hidden, vocab = int(config["hidden_size"]), int(config["vocab_size"])
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    modules = module_shapes(config)
    for i in range(int(config["num_hidden_layers"])):
        layer = f"model.layers.{i}"
        shapes[f"{layer}.input_layernorm.weight"] = (hidden,)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            n_in, n_out = modules[name]
            shapes[f"{layer}.self_attn.{name}.weight"] = (n_out, n_in)
        shapes[f"{layer}.post_attention_layernorm.weight"] = (hidden,)
        for name in ("gate_proj", "up_proj", "down_proj"):
            n_in, n_out = modules[name]
            shapes[f"{layer}.mlp.{name}.weight"] = (n_out, n_in)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def parameter_count(config: Mapping[str, Any]) -> int:
    return sum(math.prod(s) for s in weight_shapes(config).values())


def _from_pool(count: int, pool: bytes, rng: random.Random) -> bytes:
    """``count`` bfloat16 values: pieces of ``pool`` (of random values) from random offsets, so an 8B-shaped
    model (15 GB) is written at the disk's speed, not at that of drawing 7.5 billion random values."""
    parts, left = [], count
    while left:
        n = min(left, rng.randrange(_POOL // 4, _POOL // 2))
        start = rng.randrange(_POOL - n)
        parts.append(pool[2 * start : 2 * (start + n)])
        left -= n
    return b"".join(parts)


def write_random_llama(folder: Path, config: Mapping[str, Any], seed: int = 0) -> Path:
    """``folder/config.json`` and ``folder/model.safetensors`` (see the module's docstring); returns
    ``folder``. Written again only when the config or the seed changed (a marker file records both)."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = json.dumps({"config": config, "seed": seed}, sort_keys=True)
    marker = folder / ".random-llama"
    if marker.is_file() and marker.read_text() == stamp and (folder / WEIGHTS).is_file():
        return folder
    marker.unlink(missing_ok=True)
    rng = random.Random(seed)
    pool = random_bf16(_POOL, rng)

    def data(name: str):
        if name.endswith("norm.weight"):
            return lambda count: _ONE_BF16 * count
        return lambda count: _from_pool(count, pool, rng)

    tensors = [(name, shape, data(name)) for name, shape in weight_shapes(config).items()]
    write_bf16_safetensors(folder / WEIGHTS, tensors)
    (folder / "config.json").write_text(json.dumps(dict(config), indent=1) + "\n")
    marker.write_text(stamp)
    return folder
