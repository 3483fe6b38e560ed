"""Flags of ``python -m dynamo_worker.mocker``: SGLang's server flags (as found in Dynamo manifests,
passed unchanged) plus the mocker's own (timing model, KV cache size, rendezvous bounds).

SGLang flags the mocker does not simulate are accepted and named in one log line at startup.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from dynamo_api import contract
from dynamo_api.settings_sources import Settings
from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from dynamo_worker.mocker.timing import TimingModel
from dynamo_worker.multimodal.settings import MultimodalSettings
from dynamo_worker.profile.model import load_profile
from dynamo_worker.runtime.lora_checks import dummy_weights_block
from dynamo_worker.runtime.model_files import is_embedding_model
from dynamo_worker.runtime.settings import RuntimeSettings, add_model_arguments, settings_from_args

__all__ = ["MockerSettings", "parse_args"]

log = logging.getLogger(__name__)


class MockerSettings(Settings):
    """A simulated SGLang engine: same flags, same protocol, no GPU."""

    model_config = SettingsConfigDict(cli_shortcuts={"model-path": "model", "tp-size": "tp", "dp-size": "dp"})

    # --- SGLang flags ---------------------------------------------------------------------------
    model_path: str | None = Field(
        None,
        description="Model folder or hub id (SGLang --model-path). A folder provides the tokenizer.",
    )
    tokenizer_path: str | None = Field(None, description="Tokenizer folder (SGLang --tokenizer-path).")
    served_model_name: str | None = Field(
        None, description="Model name clients ask for (default: model path)."
    )
    page_size: int = Field(16, ge=1, le=4096, description="Tokens per KV block (SGLang --page-size).")
    tp_size: int = Field(
        1,
        ge=1,
        description="Tensor parallel size (accepted).",
    )
    dp_size: int = Field(
        1,
        ge=1,
        description="Data parallel ranks, each with its own KV cache of --num-kv-blocks and KV events.",
    )
    disaggregation_mode: Literal["null", "prefill", "decode"] = Field(
        "null", description="null: aggregated; prefill or decode: one leg of disaggregated serving."
    )
    disaggregation_bootstrap_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Prefill workers: rendezvous port decode legs connect to; 0 picks a free port, which "
        "discovery publishes (as the SGLang worker does without the flag; a rendered pod always sets it).",
    )
    disaggregation_transfer_backend: str = Field("mooncake", description="KV transfer backend (accepted).")
    host: str = Field("127.0.0.1", description="SGLang HTTP host (accepted; the runtime serves requests).")
    port: int = Field(
        contract.SGLANG_HTTP_PORT, description="SGLang HTTP port (accepted; the runtime serves requests)."
    )
    trust_remote_code: bool = Field(False, description="Accepted.")
    skip_tokenizer_init: bool = Field(False, description="Accepted (the mocker always works on token ids).")
    mem_fraction_static: float | None = Field(None, gt=0, le=1, description="Accepted.")
    context_length: int | None = Field(
        None, ge=2, description="Context length (default: config.json, else 4096)."
    )
    max_running_requests: int = Field(256, ge=1, description="Sequences decoded at once.")
    max_prefill_tokens: int = Field(16384, ge=1, description="Token budget of new prefill tokens per step.")
    chunked_prefill_size: int | None = Field(
        None,
        description="Most new prefill tokens one step takes, as in SGLang (with --max-prefill-tokens, the "
        "smaller wins; <= 0: no limit of its own).",
    )
    enable_mixed_chunk: bool = Field(
        False,
        description="Run a step's prefills together with one decode step of the running batch, as SGLang's "
        "flag does (default: a prefill step runs alone and decoding waits for it).",
    )
    max_total_tokens: int | None = Field(
        None,
        ge=1,
        description="KV cache size in tokens (SGLang --max-total-tokens): when set, the cache has "
        "max_total_tokens // page_size blocks and --num-kv-blocks is not used.",
    )
    enable_hierarchical_cache: bool = Field(
        False,
        description="SGLang's HiCache: a host-memory tier behind the GPU's KV cache, simulated as SGLang's "
        "default write_through policy (every GPU block copied to host memory, GPU evictions demoted there, "
        "host hits loaded back at --host-load-gb-s, the same KV events). --hicache-write-policy, "
        "--hicache-io-backend, --hicache-mem-layout and --hicache-storage-backend are accepted and not "
        "simulated (named at startup with the other ignored flags).",
    )
    disaggregation_decode_enable_radix_cache: bool = Field(
        False,
        description="SGLang's flag for a prefix cache on a decode worker (which HiCache there needs); "
        "accepted, and allows --enable-hierarchical-cache on a decode worker as in SGLang (the mocker's "
        "decode worker keeps no prefix cache either way).",
    )
    hicache_ratio: float = Field(
        2.0, gt=0, description="Host KV cache size as a multiple of the GPU's (SGLang --hicache-ratio)."
    )
    hicache_size: int = Field(
        0,
        ge=0,
        description="Host KV cache size in GB, overriding --hicache-ratio when set (SGLang --hicache-size); "
        "blocks = size / (page_size x KV bytes per token).",
    )
    kv_events_config: str | None = Field(
        None,
        description="Accepted (SGLang's KV events publisher, which the operator wires for KV routing): the "
        "mocker always publishes its KV events on the event plane.",
    )
    random_seed: int = Field(0, description="Seed of the emitted tokens (with the request's own seed).")
    nnodes: int = Field(1, ge=1, description="Nodes of a multinode engine (accepted).")
    node_rank: int = Field(0, ge=0, description="Rank of this node; ranks > 0 register nothing and idle.")
    dist_init_addr: str | None = Field(None, description="Accepted (multinode rendezvous address).")

    # --- mocker flags ---------------------------------------------------------------------------
    model_dir: Path | None = Field(
        None,
        description="Folder with tokenizer.json etc. when --model-path is a hub id (default: tiny model).",
    )
    num_kv_blocks: int = Field(16384, ge=1, description="KV cache size in blocks of --page-size tokens.")
    profile: str | None = Field(
        None,
        description="Profile file (python -m dynamo_worker.profile), or builtin:<name>: its TTFT and ITL "
        "tables replace the prefill_* and decode_* knobs.",
    )
    speedup: float = Field(1.0, gt=0, description="Divides every simulated duration (10: ten times faster).")
    prefill_base_ms: float = Field(5.0, ge=0, description="Fixed cost of a prefill (ms).")
    prefill_per_token_us: float = Field(50.0, ge=0, description="Prefill cost per uncached token (us).")
    prefill_attention_ns: float = Field(
        0.5, ge=0, description="Prefill cost per (new token x context token) (ns)."
    )
    decode_base_ms: float = Field(8.0, ge=0, description="Fixed cost of a decode step (ms).")
    decode_per_seq_us: float = Field(20.0, ge=0, description="Decode step cost per running sequence (us).")
    decode_per_kv_token_ns: float = Field(
        10.0, ge=0, description="Decode step cost per KV token in the batch (ns)."
    )
    kv_bytes_per_token: int | None = Field(
        None,
        ge=0,
        description="KV bytes per token moved prefill->decode (default: from config.json, else 131072).",
    )
    kv_transfer_gbps: float = Field(100.0, gt=0, description="Prefill->decode bandwidth (gigabits/s).")
    kv_transfer_latency_ms: float = Field(1.0, ge=0, description="Fixed cost of a KV transfer (ms).")
    kv_first_transfer_s: float = Field(
        3.0,
        ge=0,
        description="Decode workers: what the first KV transfer from a prefill engine costs on top (s), once "
        "per pair, as opening a NIXL connection does on GPUs (3 s measured on a warm H100/H200 machine, 12 s "
        "on a cold one); the frontend warms each new pair before user traffic. 0: free.",
    )
    host_load_gb_s: float = Field(
        50.0,
        gt=0,
        description="HiCache host->GPU bandwidth for loading host hits back (GB/s; default: a pinned copy "
        "over PCIe Gen5 x16 on an H100). Per block: page_size x KV bytes per token / this.",
    )
    bootstrap_timeout_s: float = Field(
        30.0, gt=0, description="How long a prefill or decode leg waits for its peer before failing."
    )
    eos_probability: float = Field(
        0.0, ge=0, le=1, description="Chance per token of emitting eos (ends with 'stop'); 0: never."
    )
    health_fault_file: Path | None = Field(
        None,
        description="Simulated engine fault: while this file exists the health check fails, as SGLang's "
        "canary does when its scheduler hangs (to exercise what a worker does about it).",
    )
    kv_transfer_fault_file: Path | None = Field(
        None,
        description="Simulated engine fault: while this file exists, a decode leg's KV transfer never "
        "completes and the leg waits until it is cancelled (a transfer lost while both workers stay up).",
    )
    vocab_size: int = Field(32000, ge=4, description="Token ids to emit from when there is no tokenizer.")
    # --- SGLang serving flags the mocker honours (published in the model card) --------------------
    is_embedding: bool = Field(
        False, description="Serve embeddings (SGLang --is-embedding): deterministic vectors from the tokens."
    )
    embedding_dim: int | None = Field(
        None, ge=1, description="Size of the mocker's vectors (default: hidden_size of config.json, else 64)."
    )
    tool_call_parser: str | None = Field(
        None, description="SGLang tool-call parser name the frontend applies (e.g. qwen25, llama3, gpt-oss)."
    )
    reasoning_parser: str | None = Field(
        None, description="SGLang reasoning parser name the frontend applies (e.g. deepseek-r1, qwen3)."
    )
    grammar_backend: str = Field(
        "xgrammar",
        description="SGLang grammar backend; the mocker answers json_schema constraints with a JSON instance "
        "of the schema, and 'none' refuses constrained requests as SGLang does.",
    )
    script: Path | None = Field(
        None,
        description="JSON list of {match, reply}: a prompt containing 'match' gets 'reply' as its output.",
    )
    # --- LoRA (SGLang's flags; /v1/loras on the system port loads and unloads) --------------------
    enable_lora: bool = Field(
        False, description="Serve LoRA adapters (SGLang --enable-lora; --lora-paths implies it)."
    )
    lora_paths: list[str] | None = Field(
        None,
        description="Adapters loaded at start, as SGLang takes them: PATH, NAME=PATH or JSON "
        '{"lora_name", "lora_path", "pinned"} (several after one flag, or the flag repeated).',
    )
    max_lora_rank: int | None = Field(
        None, ge=1, description="Largest adapter rank (default: the largest of --lora-paths)."
    )
    lora_target_modules: list[str] | None = Field(
        None,
        description="Modules adapters may target, or 'all' (default: those of --lora-paths).",
    )
    max_loras_per_batch: int = Field(
        8, ge=1, description="Distinct adapters one batch runs, the base model counting as one."
    )
    max_loaded_loras: int | None = Field(
        None,
        ge=1,
        description="Adapters held at once; loading past it evicts the least recently used unpinned one.",
    )
    lora_eviction_policy: Literal["lru", "fifo"] = Field(
        "lru", description="Which adapter leaves the GPU slots for a new one (SGLang's flag)."
    )
    lora_backend: str = Field("csgmv", description="Accepted (SGLang's LoRA kernel backend).")
    load_format: str = Field(
        "auto",
        description="SGLang's --load-format: the mocker reads no weights, but with 'dummy' it can load no "
        "LoRA adapter, as SGLang cannot (--lora-paths is refused, /v1/loras answers LoraNotSupported).",
    )
    lora_load_ms: float = Field(200.0, ge=0, description="Simulated time to load an adapter (ms).")
    lora_swap_ms: float = Field(
        5.0,
        ge=0,
        description="Simulated time a scheduler step pays per adapter it copies into the GPU slots (ms).",
    )
    # --- multimodal roles (--role encode | diffusion) --------------------------------------------
    mm_hidden_size: int = Field(64, ge=1, le=16384, description="encode: values per image token.")
    mm_max_image_tokens: int = Field(256, ge=1, description="encode: image tokens per image at most.")
    encode_base_ms: float = Field(10.0, ge=0, description="encode: fixed cost of one encode call (ms).")
    encode_per_token_us: float = Field(100.0, ge=0, description="encode: cost per image token (us).")
    diffusion_step_ms: float = Field(20.0, ge=0, description="diffusion: cost per inference step per image.")
    diffusion_default_steps: int = Field(20, ge=1, description="diffusion: steps when a request names none.")

    @property
    def role(self) -> Literal["agg", "prefill", "decode"]:
        return "agg" if self.disaggregation_mode == "null" else self.disaggregation_mode

    @model_validator(mode="after")
    def _hicache_on_decode(self) -> MockerSettings:
        """SGLang refuses HiCache on a decode worker without a prefix cache there; so does the mocker."""
        if (
            self.enable_hierarchical_cache
            and self.disaggregation_mode == "decode"
            and not self.disaggregation_decode_enable_radix_cache
        ):
            raise ValueError(
                "--enable-hierarchical-cache on a decode worker needs "
                "--disaggregation-decode-enable-radix-cache (SGLang refuses it too: a decode worker keeps no "
                "prefix cache by default); give HiCache to the prefill workers only, or add that flag"
            )
        return self

    @model_validator(mode="after")
    def _lora_flags(self) -> MockerSettings:
        """SGLang's own checks of its LoRA flags, so the mocker refuses what SGLang refuses."""
        if not self.lora_enabled:
            return self
        if not self.lora_paths and not (self.max_lora_rank and self.lora_target_modules):
            raise ValueError(
                "--enable-lora without --lora-paths needs --max-lora-rank and --lora-target-modules (as "
                "SGLang does): they size the adapter slots before any adapter is loaded"
            )
        if self.lora_paths and (why := dummy_weights_block(True, self.load_format)):
            raise ValueError(f"--lora-paths cannot be loaded with --load-format dummy: {why}")
        cap = self.max_loaded_loras
        if cap is not None and cap < self.max_loras_per_batch:
            raise ValueError(
                f"--max-loaded-loras {cap} is below --max-loras-per-batch {self.max_loras_per_batch}; "
                "raise it (SGLang refuses this too)"
            )
        if cap is not None and len(self.lora_paths or []) > cap:
            raise ValueError(f"--lora-paths lists more adapters than --max-loaded-loras {cap}")
        return self

    @property
    def lora_enabled(self) -> bool:
        return self.enable_lora or bool(self.lora_paths)

    @property
    def gpu_blocks(self) -> int:
        """KV cache blocks per rank: --max-total-tokens when given, else --num-kv-blocks."""
        if self.max_total_tokens is not None:
            return max(self.max_total_tokens // self.page_size, 1)
        return self.num_kv_blocks

    def host_blocks(self, kv_bytes_per_token: int) -> int:
        """HiCache's host memory in blocks (0 without --enable-hierarchical-cache), as SGLang sizes it."""
        if not self.enable_hierarchical_cache:
            return 0
        if self.hicache_size > 0:
            return max(int(self.hicache_size * 1e9 // (kv_bytes_per_token * self.page_size)), 1)
        return max(int(self.gpu_blocks * self.hicache_ratio), 1)

    @property
    def prefill_budget(self) -> int:
        """New prefill tokens one scheduler step may take (SGLang: the smaller of both limits)."""
        chunk = self.chunked_prefill_size
        return min(self.max_prefill_tokens, chunk) if chunk and chunk > 0 else self.max_prefill_tokens

    def timing(self, kv_bytes_per_token: int) -> TimingModel:
        return TimingModel(
            prefill_base_ms=self.prefill_base_ms,
            prefill_per_token_us=self.prefill_per_token_us,
            prefill_attention_ns=self.prefill_attention_ns,
            decode_base_ms=self.decode_base_ms,
            decode_per_seq_us=self.decode_per_seq_us,
            decode_per_kv_token_ns=self.decode_per_kv_token_ns,
            kv_bytes_per_token=kv_bytes_per_token,
            kv_transfer_gbps=self.kv_transfer_gbps,
            kv_transfer_latency_ms=self.kv_transfer_latency_ms,
            host_load_gb_s=self.host_load_gb_s,
            speedup=self.speedup,
            profile=load_profile(self.profile) if self.profile else None,
        )


# SGLang flags that take several values after one flag (argparse nargs="*"), e.g.
# ``--lora-paths a=/x b=/y``: the parser here takes one value per flag, so they are spread out first.
MULTI_VALUE_FLAGS = ("--lora-paths", "--lora-target-modules")


def spread_values(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``--flag a b`` as ``--flag a --flag b`` for each of ``flags`` (values end at the next ``-x``). Pure."""
    out: list[str] = []
    current: str | None = None
    for token in argv:
        if token.startswith("-"):
            current = token if token in flags else None
            if current is None:
                out.append(token)
            continue
        if current is not None:
            out += [current, token]
        else:
            out.append(token)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dynamo_worker.mocker",
        allow_abbrev=False,
        description="A simulated SGLang worker: serves the request plane with a timing model, a KV block "
        "manager with prefix caching and real KV events, and prefill/decode rendezvous. Other SGLang "
        "flags are accepted and ignored.",
    )
    RuntimeSettings.add_arguments(parser)
    add_model_arguments(parser, MockerSettings, "engine (SGLang flags and mocker knobs)")
    add_model_arguments(parser, MultimodalSettings, "multimodal roles")
    return parser


def parse_args(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> tuple[RuntimeSettings, MockerSettings, list[str]]:
    """Runtime settings, mocker settings, and the unknown (ignored) arguments."""
    runtime, mocker, _, unknown = parse_all(argv, env)
    return runtime, mocker, unknown


def parse_all(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> tuple[RuntimeSettings, MockerSettings, MultimodalSettings, list[str]]:
    """Runtime, mocker and multimodal settings, and the unknown (ignored) arguments."""
    argv = spread_values(sys.argv[1:] if argv is None else argv, MULTI_VALUE_FLAGS)
    args, unknown = build_parser().parse_known_args(argv)
    # settings_from_args takes the flags of its own model's fields from the namespace
    runtime = RuntimeSettings.from_args(args, env)
    mocker = settings_from_args(MockerSettings, args, {})
    multimodal = settings_from_args(MultimodalSettings, args, {})
    if not mocker.is_embedding and (
        multimodal.embedding_worker or is_embedding_model(mocker.model_dir, mocker.model_path)
    ):
        log.info(
            "Serving embeddings model=%s reason=%s",
            mocker.model_path,
            "--embedding-worker" if multimodal.embedding_worker else "its sentence-transformers modules pool",
        )
        mocker = mocker.model_copy(update={"is_embedding": True})
    return runtime, mocker, multimodal, unknown
