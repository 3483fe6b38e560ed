"""LoRA adapters in PEFT's format, with random weights, for a model folder's shapes: for tests (the mocker
reads ``adapter_config.json``) and for the GPU proof (SGLang loads the weights into the 8B-shaped dummy
model of ``tests/gpu/model``).

``write_adapter(config, out, rank=8)`` writes ``out/adapter_config.json`` (``peft_type`` LORA, ``r``,
``lora_alpha``, ``target_modules``) and ``out/adapter_model.safetensors``: for every layer and target
module, ``lora_A`` (rank x in) and ``lora_B`` (out x rank), named as PEFT saves a Llama adapter
(``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight``). The weights are bfloat16 of
magnitude 2**-7 to 2**-5 with random signs and mantissas, from ``seed``: B is not zero (as PEFT
initializes it), so each adapter changes the model's output, and differently per seed. Only the
standard library: the safetensors format is an 8-byte header length, a JSON header and the raw data.

    python -m tests.support.peft_adapters tests/gpu/model /tmp/adapters/a1 --rank 8 --seed 1
"""

from __future__ import annotations

import argparse
import json
import math
import random
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_TARGETS", "module_shapes", "random_bf16", "write_adapter", "write_bf16_safetensors"]

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
# bfloat16's high byte for exponent 120/121 (2**-7 .. 2**-5), keeping the random sign bit
_HIGH = bytes(0x3C | (i & 0x80) for i in range(256))


def module_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each LoRA target module of a Llama-shaped ``config.json``."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    inter = int(config["intermediate_size"])
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def _tensors(
    config: Mapping[str, Any], rank: int, targets: Sequence[str]
) -> Iterator[tuple[str, tuple[int, int]]]:
    shapes = module_shapes(config)
    for layer in range(int(config["num_hidden_layers"])):
        for module in targets:
            where = "self_attn" if module in _ATTENTION else "mlp"
            n_in, n_out = shapes[module]
            prefix = f"base_model.model.model.layers.{layer}.{where}.{module}"
            yield f"{prefix}.lora_A.weight", (rank, n_in)
            yield f"{prefix}.lora_B.weight", (n_out, rank)


def random_bf16(count: int, rng: random.Random) -> bytes:
    """``count`` bfloat16 values of magnitude 2**-7 to 2**-5 with random signs and mantissas."""
    out = bytearray(2 * count)
    out[0::2] = rng.randbytes(count)  # mantissa and the exponent's lowest bit
    out[1::2] = rng.randbytes(count).translate(_HIGH)  # sign and the exponent's other bits
    return bytes(out)


def write_bf16_safetensors(
    path: Path, tensors: Sequence[tuple[str, Sequence[int], Callable[[int], bytes]]]
) -> Path:
    """A safetensors file of bfloat16 tensors ``(name, shape, data)``: ``data(count)`` gives a tensor's
    ``2 * count`` bytes, called in order, one tensor in memory at a time."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, _ in tensors:
        size = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, shape, data in tensors:
            f.write(data(math.prod(shape)))
    return path


def write_adapter(
    config: Mapping[str, Any] | Path,
    out: Path,
    *,
    rank: int,
    targets: Sequence[str] = DEFAULT_TARGETS,
    alpha: int | None = None,
    seed: int = 0,
    base_model: str = "",
) -> Path:
    """Write a PEFT LoRA adapter for ``config`` (a model folder, or its ``config.json`` as a dict) into
    ``out``; returns ``out``. ``alpha`` defaults to twice the rank."""
    if isinstance(config, Path):
        config = json.loads((config / "config.json").read_text())
    unknown = sorted(set(targets) - set(DEFAULT_TARGETS))
    if unknown:
        raise ValueError(f"unknown target modules {unknown}; use some of {DEFAULT_TARGETS}")
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    tensors = [
        (name, shape, lambda count: random_bf16(count, rng))
        for name, shape in sorted(_tensors(config, rank, targets))
    ]
    write_bf16_safetensors(out / "adapter_model.safetensors", tensors)
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": alpha if alpha is not None else 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": list(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_dora": False,
        "inference_mode": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path, help="the model folder (its config.json gives the shapes)")
    parser.add_argument("out", type=Path, help="the adapter folder to write")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--targets", nargs="+", default=list(DEFAULT_TARGETS))
    args = parser.parse_args(argv)
    write_adapter(args.model_dir, args.out, rank=args.rank, targets=args.targets, seed=args.seed)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
