"""What a worker checks of a LoRA adapter before its engine sees it: the source uri, the PEFT folder,
the fit against the engine's limits (flags, or what SGLang infers from ``--lora-paths``), and SGLang's
``--lora-paths`` forms; each refusal has its reason and names the fix."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from dynamo_worker.runtime.lora_checks import (
    AdapterConfig,
    LoraError,
    LoraLimits,
    StartupAdapter,
    check_fits,
    effective_limits,
    normalize_targets,
    parse_adapter_config,
    parse_lora_paths,
    parse_source,
    read_adapter_config,
    same_source,
)

from tests.support.peft_adapters import write_adapter

TINY = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2}


@pytest.mark.parametrize(
    ("uri", "scheme", "location", "revision"),
    [
        ("file:///data/a1", "file", "/data/a1", None),
        ("/data/a1/", "file", "/data/a1", None),
        ("hf://org/repo", "hf", "org/repo", None),
        ("hf://org/repo@v2", "hf", "org/repo", "v2"),
    ],
)
def test_sources_it_reads(uri, scheme, location, revision):
    source = parse_source(uri)
    assert (source.scheme, source.location, source.revision) == (scheme, location, revision)


@pytest.mark.parametrize(
    ("uri", "fix"),
    [
        ("file://data/a1", "three slashes"),
        ("hf://repo-without-org", "hf://org/repo"),
        ("s3://bucket/key", "copy the adapter folder to a volume"),
        ("gs://bucket/key", "file:///abs/path"),
    ],
)
def test_sources_it_refuses_name_the_fix(uri, fix):
    with pytest.raises(LoraError) as e:
        parse_source(uri)
    assert e.value.reason == "InvalidSource" and e.value.status == 400 and fix in e.value.message


def test_a_folder_and_its_file_uri_are_one_source():
    assert same_source("file:///data/a1", "/data/a1/")
    assert not same_source("file:///data/a1", "file:///data/a2")


def test_a_peft_folder_is_read_and_anything_else_is_refused(tmp_path):
    folder = write_adapter(TINY, tmp_path / "a", rank=8, targets=["q_proj", "v_proj", "down_proj"])
    assert read_adapter_config(folder) == AdapterConfig(8, frozenset({"qkv_proj", "down_proj"}))
    (folder / "adapter_model.safetensors").unlink()
    with pytest.raises(LoraError, match="no weights"):
        read_adapter_config(folder)
    with pytest.raises(LoraError, match=r"no adapter_config\.json"):
        read_adapter_config(tmp_path)
    with pytest.raises(LoraError, match="not a folder"):
        read_adapter_config(tmp_path / "missing")


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"peft_type": "IA3", "r": 8}, "only LoRA adapters"),
        ({"r": 0, "target_modules": ["q_proj"], "lora_alpha": 16}, "positive integer rank"),
        ({"r": 8, "lora_alpha": 16}, "target_modules"),
        ({"r": 8, "target_modules": ["q_proj"]}, "lora_alpha"),
        ([], "not a JSON object"),
    ],
)
def test_an_adapter_config_without_what_sglang_reads_is_refused(config, problem):
    with pytest.raises(LoraError) as e:
        parse_adapter_config(config, "/x")
    assert e.value.reason == "InvalidSource" and problem in e.value.message


def test_targets_are_compared_as_sglang_normalizes_them():
    assert normalize_targets(["model.layers.0.self_attn.q_proj", "k_proj", "up_proj"]) == {
        "qkv_proj",
        "gate_up_proj",
    }
    assert normalize_targets("all-linear") == {"all"}


def test_fit_rank_targets_and_dora():
    limits = LoraLimits(max_lora_rank=16, target_modules=normalize_targets(["q_proj", "v_proj"]))
    check_fits("a", AdapterConfig(16, frozenset({"qkv_proj"})), limits)
    check_fits("a", AdapterConfig(8, frozenset({"all"})), limits)
    with pytest.raises(LoraError) as rank:
        check_fits("a", AdapterConfig(32, frozenset({"qkv_proj"})), limits)
    assert rank.value.reason == "RankTooLarge" and "--max-lora-rank 32" in rank.value.message
    with pytest.raises(LoraError) as targets:
        check_fits("a", AdapterConfig(8, frozenset({"qkv_proj", "down_proj"})), limits)
    assert targets.value.reason == "IncompatibleAdapter" and "down_proj" in targets.value.message
    with pytest.raises(LoraError, match="DoRA"):
        check_fits("a", AdapterConfig(8, frozenset({"qkv_proj"}), use_dora=True), limits)
    check_fits(
        "a", AdapterConfig(64, frozenset({"down_proj"})), LoraLimits(target_modules=frozenset({"all"}))
    )


def test_limits_not_given_are_inferred_from_the_startup_adapters_as_sglang_does():
    startup = [AdapterConfig(8, frozenset({"qkv_proj"})), AdapterConfig(16, frozenset({"o_proj"}))]
    limits = effective_limits(LoraLimits(max_loras_per_batch=4), startup)
    assert (limits.max_lora_rank, limits.target_modules) == (16, {"qkv_proj", "o_proj"})
    given = effective_limits(LoraLimits(max_lora_rank=64), startup)
    assert given.max_lora_rank == 64


def test_lora_paths_in_every_form_sglang_takes():
    pinned = json.dumps({"lora_name": "c", "lora_path": "/p/c", "pinned": True})
    lora_ref = SimpleNamespace(lora_name="d", lora_path="/p/d", pinned=False)  # SGLang's LoRARef
    assert parse_lora_paths(["/p/a", "b=/p/b", pinned, lora_ref]) == [
        StartupAdapter("/p/a", "/p/a"),
        StartupAdapter("b", "/p/b"),
        StartupAdapter("c", "/p/c", True),
        StartupAdapter("d", "/p/d"),
    ]
    assert parse_lora_paths({"e": "/p/e"}) == [StartupAdapter("e", "/p/e")]
    assert parse_lora_paths(None) == []
    with pytest.raises(ValueError, match="NAME=PATH"):
        parse_lora_paths(['{"lora_path": "/p"}'])
