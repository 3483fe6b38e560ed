"""The mocker's timing model: how long a simulated engine step takes. Pure functions, no clock.

More: docs/module-notes.md (dynamo_worker.mocker.timing)."""

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
    host_load_gb_s: float = 50.0  # host memory -> GPU (HiCache load-back), gigabytes/s
    speedup: float = 1.0
    profile: Profile | None = None

    def __post_init__(self) -> None:
        if self.speedup <= 0:
            raise ValueError("speedup must be > 0")
        if self.kv_transfer_gbps <= 0:
            raise ValueError("kv_transfer_gbps must be > 0")
        if self.host_load_gb_s <= 0:
            raise ValueError("host_load_gb_s must be > 0")
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
        p = self.profile
        new = [max(n, 1) for n, _ in prefills]
        attention = p.attention_s() * sum(n * (n + c) for n, (_, c) in zip(new, prefills, strict=True))
        step = max(p.pass_s(sum(new)) + attention, max(p.ttft_s(n) for n in new))
        return step / self.speedup

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

    def load_back_s(self, tokens: int) -> float:
        """Loading ``tokens`` tokens' KV from host memory into the GPU (HiCache host hits)."""
        return tokens * self.kv_bytes_per_token / (self.host_load_gb_s * 1e9) / self.speedup

    def kv_transfer_s(self, tokens: int) -> float:
        bytes_per_s = self.kv_transfer_gbps * 1e9 / 8
        t = self.kv_transfer_latency_ms / 1e3 + tokens * self.kv_bytes_per_token / bytes_per_s
        return t / self.speedup
