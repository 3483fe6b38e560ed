"""Routing policies: pick one worker among candidates. Pure: no I/O, randomness comes from the caller.

``round-robin`` cycles through the candidates (sorted by id, so the order is stable), ``random`` draws
uniformly, and ``kv`` minimises a cost that trades prefix-cache reuse against load:

    cost(w) = overlap_weight * uncached_blocks(w) + load_blocks(w)

    uncached_blocks(w) = prompt_blocks - overlap_blocks(w)
        prompt_blocks: full ``page_size`` blocks of the prompt; overlap_blocks(w): how many leading
        prompt blocks worker w holds in its KV cache (``KvIndex.overlaps``).
    load_blocks(w) = inflight_blocks(w) + other_blocks(w) + waiting(w)
        inflight_blocks: prompt blocks of the requests this frontend sent to w that have not finished
        (exact and immediate); other_blocks: the rest of w's active KV blocks from its latest
        ``LoadMetrics`` = max(0, active_blocks - the most blocks this frontend had in flight on w since
        the report before), i.e. other frontends' requests and generated tokens; waiting: requests
        queued on w (one block each, so a saturated worker is avoided even when blocks look free).

Counting our own requests ourselves means a load report that lags behind routing (a burst) or behind
a finished request (a report sent while it ran) neither hides nor double-counts them. Both terms count
KV blocks: the first is the prefill work the request would cost on w, the second the work w already
has. ``overlap_weight`` (``--kv-overlap-weight``, default 1.0) says how much one block of avoided
prefill is worth against one block of queued work; 0 routes on load alone. Candidates of equal cost
are chosen among at random, so identical workers share the load.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "KvCandidate",
    "RoundRobin",
    "RouterMode",
    "choose_random",
    "kv_choose",
    "kv_cost",
]

RouterMode = Literal["round-robin", "random", "kv"]


class RoundRobin:
    """Cycle through candidates in id order; a key keeps separate cursors (e.g. per model and role)."""

    def __init__(self) -> None:
        self._cursor: dict[str, int] = {}

    def choose(self, key: str, candidates: Sequence[str]) -> str:
        if not candidates:
            raise ValueError("no candidates to choose from")
        ordered = sorted(candidates)
        i = self._cursor.get(key, 0)
        self._cursor[key] = i + 1
        return ordered[i % len(ordered)]


def choose_random(candidates: Sequence[str], rng: random.Random) -> str:
    if not candidates:
        raise ValueError("no candidates to choose from")
    return rng.choice(sorted(candidates))


@dataclass(frozen=True)
class KvCandidate:
    """One worker as the kv policy sees it."""

    worker_id: str
    overlap_blocks: int = 0
    inflight_blocks: int = 0
    other_blocks: int = 0
    waiting: int = 0


def kv_cost(candidate: KvCandidate, prompt_blocks: int, overlap_weight: float) -> float:
    uncached = max(prompt_blocks - candidate.overlap_blocks, 0)
    load = candidate.inflight_blocks + candidate.other_blocks + candidate.waiting
    return overlap_weight * uncached + load


def kv_choose(
    candidates: Sequence[KvCandidate],
    prompt_blocks: int,
    overlap_weight: float,
    rng: random.Random,
) -> tuple[KvCandidate, Mapping[str, float]]:
    """The cheapest candidate (ties broken at random) and every candidate's cost, for logs and tests."""
    if not candidates:
        raise ValueError("no candidates to choose from")
    costs = {c.worker_id: kv_cost(c, prompt_blocks, overlap_weight) for c in candidates}
    best = min(costs.values())
    tied = sorted((c for c in candidates if costs[c.worker_id] == best), key=lambda c: c.worker_id)
    return rng.choice(tied), costs
