"""The random-weight Llama folder of the LoRA GPU proof (``tests/support/random_llama.py``): a safetensors
file as the format defines it (8-byte little-endian header length, JSON header, raw data at the offsets it
names), with every weight a Llama needs in its Hugging Face name and shape, RMSNorm weights 1.0, the rest
finite bfloat16 of about 0.02, deterministic from the seed, written again only when asked for another
model. No safetensors or torch here: the file is read back by its definition; SGLang reading it is the
GPU proof's part."""

from __future__ import annotations

import itertools
import json
import math
import struct

import pytest

from tests.support.random_llama import WEIGHTS, llama_config, weight_shapes, write_random_llama

SHAPE = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 96, "vocab": 300}


def read(path):
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    return header, raw[8 + size :]


def bf16(data: bytes) -> list[float]:
    return [struct.unpack("<f", b"\0\0" + data[i : i + 2])[0] for i in range(0, len(data), 2)]


def test_every_llama_weight_is_written_where_the_header_says(tmp_path):
    config = llama_config(**SHAPE)
    folder = write_random_llama(tmp_path / "m", config, seed=1)
    assert json.loads((folder / "config.json").read_text()) == config
    assert config["tie_word_embeddings"] is False and config["head_dim"] == 16
    header, data = read(folder / WEIGHTS)
    assert header.pop("__metadata__") == {"format": "pt"}
    shapes = weight_shapes(config)
    assert {n: tuple(t["shape"]) for n, t in header.items()} == shapes
    assert shapes["model.embed_tokens.weight"] == shapes["lm_head.weight"] == (300, 64)
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (32, 64)  # 2 kv heads of 16
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (64, 96)
    ends = sorted(tuple(t["data_offsets"]) for t in header.values())
    assert ends[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(ends))
    assert ends[-1][1] == len(data) == 2 * sum(math.prod(s) for s in shapes.values())
    for name, t in header.items():
        start, end = t["data_offsets"]
        values = bf16(data[start:end])
        assert t["dtype"] == "BF16"
        if name.endswith("norm.weight"):
            assert set(values) == {1.0}, name
        else:
            assert all(2**-7 <= abs(v) < 2**-5 for v in values), name
            assert 0.3 < sum(v > 0 for v in values) / len(values) < 0.7, name


def test_the_same_seed_gives_the_same_file_and_another_model_is_written_again(tmp_path):
    config = llama_config(**SHAPE)
    a = (write_random_llama(tmp_path / "a", config, seed=1) / WEIGHTS).read_bytes()
    assert (write_random_llama(tmp_path / "b", config, seed=1) / WEIGHTS).read_bytes() == a
    assert (write_random_llama(tmp_path / "c", config, seed=2) / WEIGHTS).read_bytes() != a
    again = write_random_llama(tmp_path / "a", config, seed=1) / WEIGHTS
    assert again.stat().st_mtime_ns == (tmp_path / "a" / WEIGHTS).stat().st_mtime_ns
    wider = llama_config(**{**SHAPE, "hidden": 128})
    header, _ = read(write_random_llama(tmp_path / "a", wider, seed=1) / WEIGHTS)
    assert header["lm_head.weight"]["shape"] == [300, 128]


def test_shapes_that_cannot_be_a_llama_are_refused():
    with pytest.raises(ValueError, match="heads"):
        llama_config(**{**SHAPE, "heads": 5})
    with pytest.raises(ValueError, match="below vocab"):
        llama_config(**{**SHAPE, "vocab": 2})
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        weight_shapes({**llama_config(**SHAPE), "tie_word_embeddings": True})
