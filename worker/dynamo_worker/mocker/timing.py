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

A scheduler step that admits prefills takes the prefills' time and gives only them their first token
(SGLang runs prefill batches first; the running batch decodes when no prefill is waiting). With
``--enable-mixed-chunk`` the step takes the prefills plus one decode step and every running request
gets a token, as in SGLang's mixed batches.

With a profile (``--profile``, see ``dynamo_worker.profile.model``) the prefill and decode formulas
are replaced by the profile's tables. The engine runs a step's prefills as one forward pass over all
their new tokens, and only attention keeps each request to its own context. So a step prefilling
requests with ``n_i`` new tokens after ``c_i`` cached ones costs::

    pass(sum_i n_i) + attention * sum_i n_i * (n_i + c_i)

``attention`` is the profile's seconds per new token x context token (the TTFT table's curvature) and
``pass`` the TTFT table less that attention (the rest of a forward pass, which grows with the step's
tokens), and at least the profiled TTFT of the step's longest request. A lone uncached request costs
exactly its profiled TTFT, and a batch of short prompts pays the engine's fixed cost per pass (the
flat start of the TTFT table) once. A decode step costs the profiled ITL at batch ``b`` and context
``k / b``; ``speedup`` still divides both. (How many new tokens one step takes is the engine's
budget: ``--max-prefill-tokens`` and ``--chunked-prefill-size``.)

Loading ``t`` tokens' KV back from host memory (a HiCache host hit) takes the step that admits the
request::

    load_back_s = t * kv_bytes_per_token / (host_load_gb_s * 1e9) / speedup

``host_load_gb_s`` defaults to 50 GB/s, what a pinned host-to-device copy reaches over PCIe Gen5 x16
(64 GB/s a direction on the wire) on an H100; per 16-token block of an 8B model (131072 bytes a token)
that is 42 us, against 0.8 ms to prefill the block with the default ``prefill_per_token_us``.

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
