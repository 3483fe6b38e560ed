"""The kv routing policy: pick one worker among candidates. Pure: no I/O, randomness comes from the
caller. (``round-robin`` and ``random`` are the router's own: ``router.router``.)

``kv`` picks the candidate (a worker, or one attention data-parallel rank) of least ``kv_cost``:

    cost(t) = overlap_weight * new_blocks(t) + prefill_blocks(t) + decode_weight * decode_blocks(t)

in KV blocks of prefill, with a host or disk hit saving its weight of a block, a LoRA adapter not
resident costing ``lora_swap_blocks`` (and ``lora_wait_blocks`` when the slots are full), and a balance
guard (``balance_margin``) that moves a request off a cheapest candidate running too many more requests
than the idlest. Disaggregated requests pick the pair in one decision (``decode_cost``,
``decode_rank``). Ties are broken at random. The knobs are ``KvWeights``, their flags in
``frontend.settings``; the model, each term's reason and the measurements behind the defaults:
docs/kv-routing.md.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dynamo_api.frontend_args import RouterMode

__all__ = [
    "DecodeCandidate",
    "KvCandidate",
    "KvWeights",
    "RouterMode",
    "balance_margin",
    "cache_cost",
    "decode_cost",
    "decode_rank",
    "kv_choose",
    "kv_cost",
    "saved_blocks",
]

PRESSURE_FACTOR = 4  # balance guard: how much larger an imbalance must be to move into a full cache
ROOM_FRACTION = 0.5  # balance guard: a cache at most this full (after the request) has room


@dataclass(frozen=True)
class KvWeights:
    """The kv policy's knobs (see the module docstring)."""

    overlap_weight: float = 3.0
    decode_weight: float = 0.1
    balance_abs_threshold: int = 2
    balance_rel_threshold: float = 1.5
    host_hit_weight: float = 0.9
    disk_hit_weight: float = 0.25
    lora_swap_blocks: float = 4.0
    lora_wait_blocks: float = 16.0


@dataclass(frozen=True)
class KvCandidate:
    """One cache (worker, or dp rank of a worker) as the kv policy sees it."""

    worker_id: str
    overlap_blocks: int = 0  # leading prompt blocks it holds on the GPU (or is predicted to) ...
    host_blocks: int = 0  # ... then those it holds only in host memory ...
    disk_blocks: int = 0  # ... or only in HiCache's storage tier (``KvIndex.tier_overlaps``)
    prefill_blocks: int = 0
    decode_blocks: int = 0
    requests: int = 0  # requests in flight or waiting there (for the balance guard)
    free_blocks: int | None = None  # KV blocks it holds nothing in (None: unknown, counts as room)
    capacity_blocks: int | None = None  # its KV cache size in blocks
    dp_rank: int = 0
    lora_resident: bool = True  # the request's adapter is in its GPU slots (always for the base model)
    lora_slots_full: bool = False  # its batch slots all run other adapters: the request would wait

    @property
    def key(self) -> str:
        return self.worker_id if self.dp_rank == 0 else f"{self.worker_id}/dp{self.dp_rank}"


def saved_blocks(candidate: KvCandidate, weights: KvWeights) -> float:
    """The blocks of prefill the candidate's cache saves: a GPU block one, a host or disk one its weight."""
    return (
        candidate.overlap_blocks
        + weights.host_hit_weight * candidate.host_blocks
        + weights.disk_hit_weight * candidate.disk_blocks
    )


def kv_cost(candidate: KvCandidate, prompt_blocks: int, weights: KvWeights) -> float:
    return cache_cost(candidate, prompt_blocks, weights) + _load_cost(candidate, weights)


def _load_cost(candidate: KvCandidate, weights: KvWeights) -> float:
    """The part of the cost that depends on how busy the candidate is: its queued prefill and decoders."""
    return candidate.prefill_blocks + weights.decode_weight * candidate.decode_blocks


def cache_cost(candidate: KvCandidate, prompt_blocks: int, weights: KvWeights) -> float:
    """The part of the cost that depends on what the candidate holds, not on how busy it is: the
    weighted prefill its caches leave to do, and copying the request's adapter into its batch slots."""
    new = max(prompt_blocks - saved_blocks(candidate, weights), 0.0) + 1
    return (
        weights.overlap_weight * new
        + (0.0 if candidate.lora_resident else weights.lora_swap_blocks)
        + (weights.lora_wait_blocks if candidate.lora_slots_full else 0.0)
    )


def balance_margin(mean_requests: float, weights: KvWeights) -> float:
    """How many requests more than the idlest candidate the balance guard lets the cheapest run: the
    absolute threshold, or the natural swing of per-worker counts at this load if larger (two standard
    deviations of a count spread at random, ``2 * sqrt(mean)``), so that noise alone never trips it."""
    return max(float(weights.balance_abs_threshold), 2.0 * math.sqrt(mean_requests))


def _overloaded(chosen: KvCandidate, least: int, margin: float, weights: KvWeights, factor: int = 1) -> bool:
    return (
        chosen.requests - least > factor * margin and chosen.requests > weights.balance_rel_threshold * least
    )


def _has_room(candidate: KvCandidate, prompt_blocks: int) -> bool:
    """Whether the candidate's GPU cache stays at most ``ROOM_FRACTION`` full with this request's blocks
    (every block not already on its GPU: computed, or loaded back from host memory), and it has a batch
    slot for the request's adapter."""
    if candidate.lora_slots_full:
        return False
    if candidate.free_blocks is None or candidate.capacity_blocks is None:
        return True
    added = max(prompt_blocks - candidate.overlap_blocks, 0) + 1  # the blocks not on its GPU, and the tail
    after = candidate.free_blocks - added
    return after >= (1 - ROOM_FRACTION) * candidate.capacity_blocks


def kv_choose(
    candidates: Sequence[KvCandidate],
    prompt_blocks: int,
    weights: KvWeights,
    rng: random.Random,
) -> tuple[KvCandidate, Mapping[str, float]]:
    """The cheapest candidate (ties broken at random) and every candidate's cost, for logs and tests.
    Under the balance guard, the cheapest among the least loaded."""
    if not candidates:
        raise ValueError("no candidates to choose from")
    cached = {c.key: cache_cost(c, prompt_blocks, weights) for c in candidates}
    costs = {c.key: cached[c.key] + _load_cost(c, weights) for c in candidates}
    chosen = _cheapest(candidates, costs, rng)
    if len(candidates) > 1:
        least = min(c.requests for c in candidates)
        idle = [c for c in candidates if c.requests == least]
        no_cache_to_keep = cached[chosen.key] >= min(cached[c.key] for c in idle)
        if no_cache_to_keep and chosen.requests - least > weights.balance_abs_threshold:
            return _cheapest(idle, costs, rng), costs
        margin = balance_margin(sum(c.requests for c in candidates) / len(candidates), weights)
        roomy = [c for c in idle if _has_room(c, prompt_blocks)]
        if roomy and _overloaded(chosen, least, margin, weights):
            chosen = _cheapest(roomy, costs, rng)
        elif _overloaded(chosen, least, margin, weights, PRESSURE_FACTOR):
            chosen = _cheapest(idle, costs, rng)
    return chosen, costs


def _cheapest(
    candidates: Sequence[KvCandidate], costs: Mapping[str, float], rng: random.Random
) -> KvCandidate:
    best = min(costs[c.key] for c in candidates)
    tied = sorted((c for c in candidates if costs[c.key] == best), key=lambda c: c.key)
    return rng.choice(tied)


@dataclass(frozen=True)
class DecodeCandidate:
    """One decode cache (worker, or dp rank of a worker) as the decode choice sees it."""

    worker_id: str
    held_blocks: int = 0  # KV blocks held there: ours (from dispatch: SGLang reserves them at once) + others'
    capacity_blocks: int | None = None  # its KV cache size in blocks (None: unknown, always has room)
    dp_rank: int = 0

    @property
    def key(self) -> str:
        return self.worker_id if self.dp_rank == 0 else f"{self.worker_id}/dp{self.dp_rank}"

    def has_room(self, prompt_blocks: int) -> bool:
        """Whether the prompt's KV (and one block for its first tokens) fits next to what it holds."""
        return self.capacity_blocks is None or self.held_blocks + prompt_blocks + 1 <= self.capacity_blocks


def decode_cost(candidate: DecodeCandidate, weights: KvWeights) -> float:
    """What a decode worker costs a request, in blocks of prefill (see the module docstring)."""
    return weights.decode_weight * candidate.held_blocks


def decode_rank(candidate: DecodeCandidate, prompt_blocks: int, weights: KvWeights) -> tuple[bool, float]:
    """Order of decode workers: those with room first, then the cheapest."""
    return (not candidate.has_room(prompt_blocks), decode_cost(candidate, weights))
