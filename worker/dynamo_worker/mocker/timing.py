"""The mocker's timing model: how long a simulated engine step takes. Pure functions, no clock.

Prefill of one request with ``n`` uncached prompt tokens, ``c`` of its prompt tokens found in the
prefix cache::

    prefill_s = (prefill_base_ms / 1e3
                 + n * prefill_per_token_us / 1e6
                 + n * (c + n) * prefill_attention_ns / 1e9) / speedup

(the quadratic term is attention over the whole context for each new token). A request served
entirely from the cache (n == 0) still pays ``prefill_base_ms`` (its last token is recomputed).

One decode step of a batch of ``b`` running sequences holding ``k`` KV tokens in all::

    decode_step_s = (decode_base_ms / 1e3
                     + b * decode_per_seq_us / 1e6
                     + k * decode_per_kv_token_ns / 1e9) / speedup

A scheduler step that admits prefills and advances the running batch takes the sum of the prefills it
admitted plus one decode step (the batch is fused, as in SGLang's mixed batches).

With a profile (``--profile``, see ``dynamo_worker.profile.model``) the prefill and decode formulas
are replaced by the profile's tables. The profiled TTFT of a lone request holds a fixed cost per
forward pass (``F``: the TTFT table extrapolated to 0 tokens: launch, scheduling, sampling) that a step
prefilling several requests pays once, as the engine runs them in one batch. So a step's prefills,
request ``i`` with ``n_i`` new tokens after ``c_i`` cached ones, cost::

    F + sum_i (TTFT(c_i + n_i) - F) * n_i / (c_i + n_i)

(a lone uncached request costs exactly its profiled TTFT), and a decode step costs the profiled ITL at
batch ``b`` and context ``k / b``; ``speedup`` still divides both.

Moving the KV cache of ``t`` tokens from a prefill worker to a decode worker::

    kv_transfer_s = (kv_transfer_latency_ms / 1e3
                     + t * kv_bytes_per_token / (kv_transfer_gbps * 1e9 / 8)) / speedup
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dynamo_worker.profile.model import Profile

__all__ = ["TimingModel"]


@dataclass(frozen=True)
class TimingModel:
    prefill_base_ms: float = 5.0
    prefill_per_token_us: float = 50.0
    prefill_attention_ns: float = 0.5
    decode_base_ms: float = 8.0
    decode_per_seq_us: float = 20.0
    decode_per_kv_token_ns: float = 10.0
    kv_bytes_per_token: int = 131_072  # ~ Llama-3-8B in bf16: 2 * 32 layers * 8 kv heads * 128 * 2 B
    kv_transfer_gbps: float = 100.0  # network bandwidth between prefill and decode, gigabits/s
    kv_transfer_latency_ms: float = 1.0
    speedup: float = 1.0
    profile: Profile | None = None

    def __post_init__(self) -> None:
        if self.speedup <= 0:
            raise ValueError("speedup must be > 0")
        if self.kv_transfer_gbps <= 0:
            raise ValueError("kv_transfer_gbps must be > 0")
        for name in (
            "prefill_base_ms",
            "prefill_per_token_us",
            "prefill_attention_ns",
            "decode_base_ms",
            "decode_per_seq_us",
            "decode_per_kv_token_ns",
            "kv_bytes_per_token",
            "kv_transfer_latency_ms",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    def prefill_s(self, uncached_tokens: int, cached_tokens: int = 0) -> float:
        n, c = uncached_tokens, cached_tokens
        if self.profile is not None:
            return self.prefill_batch_s([(n, c)])
        t = (
            self.prefill_base_ms / 1e3
            + n * self.prefill_per_token_us / 1e6
            + n * (c + n) * self.prefill_attention_ns / 1e9
        )
        return t / self.speedup

    def prefill_batch_s(self, prefills: Sequence[tuple[int, int]]) -> float:
        """One scheduler step's prefills, each ``(uncached, cached)`` tokens (see the module doc)."""
        if not prefills:
            return 0.0
        if self.profile is None:
            return sum(self.prefill_s(n, c) for n, c in prefills)
        fixed = self.profile.ttft_s(0)
        shares = (
            (self.profile.ttft_s(max(n + c, 1)) - fixed) * max(n, 1) / max(n + c, 1) for n, c in prefills
        )
        return (fixed + sum(shares)) / self.speedup

    def decode_step_s(self, batch_size: int, kv_tokens: int) -> float:
        if batch_size <= 0:
            return 0.0
        if self.profile is not None:
            return self.profile.itl_s(batch_size, kv_tokens / batch_size) / self.speedup
        t = (
            self.decode_base_ms / 1e3
            + batch_size * self.decode_per_seq_us / 1e6
            + kv_tokens * self.decode_per_kv_token_ns / 1e9
        )
        return t / self.speedup

    def kv_transfer_s(self, tokens: int) -> float:
        bytes_per_s = self.kv_transfer_gbps * 1e9 / 8
        t = self.kv_transfer_latency_ms / 1e3 + tokens * self.kv_bytes_per_token / bytes_per_s
        return t / self.speedup
