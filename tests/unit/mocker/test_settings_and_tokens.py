"""The mocker's command line (SGLang flags from Dynamo manifests accepted unchanged, unknown ones set
aside) and its token choice (valid, readable, deterministic ids of the tokenizer)."""

from __future__ import annotations

import pytest
from dynamo_worker.mocker.settings import parse_args
from dynamo_worker.mocker.tokens import TokenSampler, prompt_digest
from dynamo_worker.runtime.settings import SettingsError
from dynamo_worker.tinymodel import SPECIAL_TOKENS, ensure_tiny_model
from tokenizers import Tokenizer

# The worker args of Dynamo's SGLang disagg example, as a manifest passes them.
MANIFEST_ARGS = [
    "--model-path", "Qwen/Qwen3-0.6B", "--served-model-name", "Qwen/Qwen3-0.6B", "--page-size", "16",
    "--tp", "1", "--trust-remote-code", "--skip-tokenizer-init", "--disaggregation-mode", "prefill",
    "--disaggregation-transfer-backend", "nixl", "--disaggregation-bootstrap-port", "12345",
    "--host", "0.0.0.0", "--mem-fraction-static", "0.82", "--kv-cache-dtype", "fp8_e4m3",
    "--enable-dp-attention",
]  # fmt: skip


def test_manifest_sglang_flags_are_accepted():
    runtime, mocker, unknown = parse_args(MANIFEST_ARGS, env={"DYN_NAMESPACE": "ns-graph"})
    assert mocker.role == "prefill" and mocker.page_size == 16 and mocker.tp_size == 1
    assert mocker.served_model_name == "Qwen/Qwen3-0.6B"
    assert mocker.disaggregation_bootstrap_port == 12345
    assert mocker.trust_remote_code and mocker.skip_tokenizer_init
    assert unknown == ["--kv-cache-dtype", "fp8_e4m3", "--enable-dp-attention"]
    assert runtime.namespace == "ns-graph"


def test_a_prefill_mocker_without_a_bootstrap_port_picks_a_free_one_as_the_sglang_worker_does():
    _, mocker, _ = parse_args(["--disaggregation-mode", "prefill"], env={})
    assert mocker.role == "prefill" and mocker.disaggregation_bootstrap_port == 0  # 0: a free port


def test_mocker_and_runtime_flags_mix():
    runtime, mocker, _ = parse_args(
        ["--speedup", "50", "--num-kv-blocks", "64", "--request-port", "0", "--tp-size", "2"], env={}
    )
    assert mocker.speedup == 50 and mocker.num_kv_blocks == 64 and mocker.tp_size == 2
    assert runtime.request_port == 0 and mocker.role == "agg"
    assert mocker.timing(100).speedup == 50


@pytest.mark.parametrize(
    ("flags", "budget"),
    [([], 16384), (["--chunked-prefill-size", "8192"], 8192), (["--max-prefill-tokens", "4096",
     "--chunked-prefill-size", "8192"], 4096), (["--chunked-prefill-size", "-1"], 16384)],
)  # fmt: skip
def test_a_step_prefills_at_most_the_smaller_of_sglangs_two_token_limits(flags, budget):
    _, mocker, _ = parse_args(flags, env={})
    assert mocker.prefill_budget == budget


def test_bad_mocker_values_name_the_flag():
    with pytest.raises(SettingsError, match="--speedup"):
        parse_args(["--speedup", "0"], env={})
    with pytest.raises(SystemExit):
        parse_args(["--disaggregation-mode", "both"], env={})


def test_tokens_are_readable_non_special_ids_of_the_tokenizer(tmp_path):
    path = ensure_tiny_model(tmp_path / "m")
    sampler = TokenSampler.from_model_dir(path, 100)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    special = {tok.token_to_id(t) for t in SPECIAL_TOKENS}
    assert not special & set(sampler.candidates)
    digest = prompt_digest([5, 6, 7], seed=0)
    ids = [sampler.token(digest, i) for i in range(50)]
    assert all(0 <= i < tok.get_vocab_size() for i in ids)
    assert tok.decode(ids).isprintable()


def test_tokens_depend_on_prompt_seed_and_position_only():
    sampler = TokenSampler.from_vocab_size(1000)
    a = prompt_digest([1, 2, 3], 0)
    assert [sampler.token(a, i) for i in range(5)] == [sampler.token(a, i) for i in range(5)]
    assert [sampler.token(a, i) for i in range(8)] != [
        sampler.token(prompt_digest([1, 2, 3], 1), i) for i in range(8)
    ]
    assert [sampler.token(a, i) for i in range(8)] != [
        sampler.token(prompt_digest([1, 2, 4], 0), i) for i in range(8)
    ]
    assert 0 <= sampler.chance(a, 3) < 1


def test_without_a_tokenizer_ids_come_from_the_vocab_size(tmp_path):
    sampler = TokenSampler.from_model_dir(tmp_path, 50)
    assert set(sampler.candidates) == set(range(3, 50))


def test_hicache_flags_size_the_host_tier_and_the_rest_are_named_as_ignored():
    """SGLang's HiCache flags: --enable-hierarchical-cache with --hicache-ratio (or --hicache-size in GB)
    size the simulated host tier; the ones the mocker does not simulate are set aside with the other
    ignored flags (named once at startup). --max-total-tokens sizes the GPU's cache as SGLang's does."""
    argv = ["--page-size", "16", "--max-total-tokens", "4096", "--enable-hierarchical-cache",
            "--hicache-ratio", "3", "--hicache-write-policy", "write_through",
            "--hicache-io-backend", "kernel", "--hicache-mem-layout", "page_first",
            "--hicache-storage-backend", "file"]  # fmt: skip
    _, mocker, unknown = parse_args(argv, env={})
    assert mocker.gpu_blocks == 256 and mocker.host_blocks(131072) == 768
    assert unknown == [
        "--hicache-write-policy", "write_through", "--hicache-io-backend", "kernel",
        "--hicache-mem-layout", "page_first", "--hicache-storage-backend", "file",
    ]  # fmt: skip
    _, sized, _ = parse_args([*argv, "--hicache-size", "2"], env={})
    assert sized.host_blocks(131072) == int(2e9 // (131072 * 16))
    _, off, _ = parse_args(["--num-kv-blocks", "100"], env={})
    assert off.gpu_blocks == 100 and off.host_blocks(131072) == 0


def test_hicache_on_a_decode_worker_is_refused_as_sglang_refuses_it():
    """SGLang refuses --enable-hierarchical-cache on a decode worker unless it keeps a prefix cache there
    (--disaggregation-decode-enable-radix-cache); the mocker refuses the same, naming the fix."""
    decode = ["--disaggregation-mode", "decode", "--enable-hierarchical-cache"]
    with pytest.raises(SettingsError, match="--disaggregation-decode-enable-radix-cache"):
        parse_args(decode, env={})
    _, mocker, _ = parse_args([*decode, "--disaggregation-decode-enable-radix-cache"], env={})
    assert mocker.enable_hierarchical_cache and mocker.role == "decode"
    _, prefill, _ = parse_args(["--disaggregation-mode", "prefill", "--enable-hierarchical-cache"], env={})
    assert prefill.enable_hierarchical_cache
