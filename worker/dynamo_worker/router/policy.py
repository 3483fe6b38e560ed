"""The kv routing policy: pick one worker among candidates. Pure: no I/O, randomness comes from the
caller. (``round-robin``, which cycles through the candidates sorted by id, and ``random``, which draws
uniformly, are the router's own: ``router.router``.)

``kv`` minimises an estimate of the work a request waits for, in KV blocks of prefill:

    cost(t) = overlap_weight * new_blocks(t) + prefill_blocks(t) + decode_weight * decode_blocks(t)

A candidate ``t`` is one cache: a worker, or one attention data-parallel rank of a worker.

    new_blocks(t) = prompt_blocks - saved_blocks(t) + 1
        the prefill this request would add on t. prompt_blocks: full ``page_size`` blocks of the
        prompt; + 1: the prompt's tail (its partial last block, or the last token an engine always
        recomputes), so that a fully cached request still counts as some work where it queues.
    saved_blocks(t) = gpu_blocks(t) + host_hit_weight * host_blocks(t) + disk_hit_weight * disk_blocks(t)
        the prefill t's cache saves. In prefix order, the prompt's leading blocks t holds
        (``KvIndex.tier_overlaps``), each in the fastest tier t holds it in, until the first block t
        holds in none: a block on the GPU saves a whole block of prefill (counting blocks *predicted*
        at routing time for requests whose KV events have not arrived yet), one in host memory
        (SGLang's HiCache) saves what is left after loading it back over PCIe, one in HiCache's storage
        tier less again.
    prefill_blocks(t) = the new blocks of the requests this frontend sent to t that are not prefilled
        yet (exact and immediate: a burst from this frontend spreads at once), plus the rest of the
        prefill t's engine reports queued (``LoadMetrics.waiting_prefill_tokens``, in blocks: other
        frontends' requests; a prefill worker's bootstrap queue included) less the most new blocks this
        frontend had queued on t since the report before (``router.Router.on_load``: what was ours in
        the report, at most; so ours never count twice, and a report between two of ours is never
        stale by more than one report period).
    decode_blocks(t) = KV blocks held by sequences decoding on t: the prompt blocks of this
        frontend's requests there past their first token, plus the rest of t's active blocks from its
        latest ``LoadMetrics`` (max(0, active_blocks - the most blocks this frontend had in flight on
        t since the report before): other frontends' requests and generated tokens).

Why these terms: a request's time to first token is the prefill queued ahead of it plus its own
prefill (both proportional to uncached blocks), plus waiting for the running batch's steps. A decode
step costs little per running sequence next to a prefill (batching is what engines are built for), so
a running sequence weighs ``decode_weight`` of a block of prefill, not a whole block: counting it as a
full block spreads a prefix over every worker whenever the one holding it is busy, each copy evicting
other prefixes, which is what made kv routing lose to round-robin under cache pressure. The decode
term still steers away from a worker that holds many sequences (its cache fills with them, evicting
prefixes), and the prefill term from one with a real backlog.

Balance guard (after SGLang's model gateway, which checks two such thresholds on the busiest worker):
the cost above keeps a prefix where it is cached even when that worker runs more requests than
others, which is right while copying the prefix elsewhere would evict other prefixes, and wrong when
there is room: then a few requests' imbalance slows every step of the busy worker (each admitted
prefill delays its decoders) for nothing. So when the cheapest candidate runs more requests than the
idlest by more than the margin (``balance_margin``: ``balance_abs_threshold``, or the natural swing of
per-worker request counts at this load, ``2 * sqrt(mean requests)``, if larger) *and* more than
``balance_rel_threshold`` times as many, the request goes to the cheapest of the least loaded
candidates that have room for its new blocks (their GPU cache stays at most ``ROOM_FRACTION`` full
with them: a per-worker sign that the fleet is not under cache pressure, as copies then evict nothing
that is needed soon; blocks held only in host memory take no GPU block, and a host hit takes GPU
blocks when it is loaded back); when none has room, only an imbalance ``PRESSURE_FACTOR`` times the
margin moves it (to the cheapest least loaded one). A prefix copied to an idle worker then serves
there too, so the load evens out. Why the natural swing: at concurrency, per-worker counts differ by a
few requests from moment to moment however well the load is spread (128 clients on 4 workers: 32
each, give or take 6), and a fixed margin of 2 read that noise as imbalance and moved returning turns
off their conversation's worker (below).

A request that no candidate's cache favours (the cheapest one's cache part of the cost, ``cache_cost``,
is no lower than the least loaded ones': a new prompt, or a prefix every worker holds) has no cached
prefix to keep it anywhere, so the natural-swing margin and the ratio, which protect a cached prefix
from load noise, do not apply to it: once the cheapest runs more than ``balance_abs_threshold``
requests more than the idlest, it goes to the cheapest of the least loaded. Within that threshold the
cost decides, so at low load it still avoids a prefill queue. Why: its cost differs between workers
only by their prefill queues, which empty within a prefill's time, so in a burst the worker whose
prefill finished first looked cheapest to every arrival until its next one, and took more. On 4 H200s,
64 chat clients whose requests came back together (2048/512 tokens) ran 19, 17, 17 and 11 requests on
the four workers through the whole second wave, where SGLang's gateway ran 17, 17, 15 and 15, and
every step of the busiest one was slower (7% fewer tokens/s at that point; 2026-11-28,
``tests/gpu/README.md``).

Disaggregated requests: the prefill worker is chosen by the cost above (its share of a request ends
when its leg ends: a prefill worker holds nothing of a request once its KV has moved), the decode worker
by ``decode_cost``: the KV blocks it holds (ours exact, others' from its reports), weighed
``decode_weight`` as above, after one rule: a decode worker without room for the prompt's KV is chosen
only when every one lacks it, because SGLang's decode worker reserves that memory before the prefill
leg may even start (its prealloc queue), so a full decode worker stalls the prefill too. The pair is
one decision (``choose_pair``): among the pairs allowed (e.g. warm ones), the prefill worker whose
best decode partner has room, then that partner.

LoRA adapters: a request for an adapter goes only to workers that hold it (the frontend's candidates),
and its blocks are the adapter's own (``KvIndex``). Among those workers, one whose GPU batch slots hold
the adapter now (``lora_resident``: it ran a request of the adapter recently, within the last
``max_loras_per_batch`` adapters it ran, or holds it pinned) saves copying it in:

    cost(t) += lora_swap_blocks          when the adapter is not resident on t
            += lora_wait_blocks          when t's slots all run other adapters now (``lora_slots_full``):
                                         the request waits until one of them drains

So an adapter stays on the workers it is resident on while they are not much busier than the rest, and
is spread to more workers when they are: through the cost (their queued prefill above the swap's
worth), or through the balance guard below, which moves a request past its thresholds only to a worker
with a free batch slot for the adapter (``_has_room``). The spread is bounded by that: an adapter is
copied to another worker only when the ones holding it run ``balance_abs_threshold`` requests more.

Knobs (flags of ``python -m dynamo_worker.frontend``; the defaults win the router benchmarks of
``make bench`` on the mocker and are the ones to start with):
- ``--kv-overlap-weight`` (default 3): worth of one block of avoided prefill; 0 routes on load only.
  Above 1 because a block computed again costs more than the request's own latency: it is GPU time
  taken from every request queued behind it, and a second copy of a prefix evicts another one. With
  1.0 a request for a prefix still being prefilled on its holder ties with computing it afresh on an
  idle worker, and prefixes get copied around under load; with 1.5 (the default until 28 November) one
  turn queued on a conversation's worker outweighed recomputing its last turn elsewhere, so under
  multi-turn load conversations kept moving (below).
- ``--kv-decode-weight`` (default 0.1): worth of one block held by a running sequence.
- ``--kv-host-hit-weight`` (default 0.9) and ``--kv-disk-hit-weight`` (default 0.25): the share of a
  block's prefill that a hit in host memory (resp. HiCache's storage tier) saves; 0 routes on the GPU
  tier alone. 0.9 is ``(TTFT miss - TTFT host hit) / (TTFT miss - TTFT GPU hit)`` as
  ``tests/gpu/run_hicache.py`` measured it on an H200 (``docs/kv-tiers.md``); the storage tier's is
  NVIDIA Dynamo's, unmeasured here.
- ``--kv-balance-abs-threshold`` (default 2) and ``--kv-balance-rel-threshold`` (default 1.5): the
  guard's smallest margin (at low load; the natural swing above takes over from a mean of 1 request a
  worker) and its ratio. With a fixed margin of 2 and an overlap weight of 1.5 (the policy until 28
  November), multi-turn at concurrency 128 on 4 simulated 8B engines (``tests/gpu/run_peers.py`` with
  ``ENGINE=mocker`` and the mocker's ``--profile builtin:sglang-8b-h100``) kept 0.62 of prompt tokens
  cached; with both changes 0.70, at a lower TTFT p90 (the long multi-turn workload with HiCache: 0.64-0.70
  to 0.75), while ``make bench``'s router scenarios keep their figures (4 prefixes that fit everywhere
  still spread at concurrency 8: a fixed margin of 16 had raised their TTFT p90 by a quarter).
- ``--kv-predict-ttl-s`` (default 30; ``router.Router``): how long a routed prompt's blocks count as
  held before KV events confirm them.
- ``--kv-lora-swap-blocks`` (default 4) and ``--kv-lora-wait-blocks`` (default 16): the worth, in blocks
  of prefill, of copying an adapter into a worker's GPU slots, and of waiting for a slot.
Candidates of equal cost are chosen among at random, so identical workers share the load.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

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

RouterMode = Literal["round-robin", "random", "kv", "direct"]
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
