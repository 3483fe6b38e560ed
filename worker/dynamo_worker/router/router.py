"""The router: the state a routing decision needs (KV index, load, in-flight work) and the decision.

No I/O: discovery, KV events and load metrics are pushed in by the frontend (``router.feed`` wires
them from NATS), and ``choose`` answers synchronously. See ``router.policy`` for the kv cost formula.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass

from dynamo_worker.protocol import InstanceRecord, KvEventBatch, LoadMetrics, hash_token_blocks
from dynamo_worker.router.index import KvIndex
from dynamo_worker.router.policy import KvCandidate, RoundRobin, RouterMode, choose_random, kv_choose

log = logging.getLogger(__name__)

__all__ = ["Choice", "Router"]


@dataclass(frozen=True)
class Choice:
    worker: InstanceRecord
    prompt_blocks: int  # full page_size blocks of the prompt on this worker
    overlap_blocks: int  # of which the kv index believes the worker caches (0 outside kv mode)


class Router:
    def __init__(self, mode: RouterMode, overlap_weight: float = 1.0, rng: random.Random | None = None):
        self.mode: RouterMode = mode
        self.overlap_weight = overlap_weight
        self.index = KvIndex()
        self._rng = rng or random.Random()
        self._round_robin = RoundRobin()
        self._inflight_blocks: dict[str, int] = {}
        self._window_peak: dict[str, int] = {}  # most blocks in flight since the last load report
        self._other_blocks: dict[str, int] = {}
        self._waiting: dict[str, int] = {}

    # --- state fed from the outside -----------------------------------------------------------

    def add_worker(self, record: InstanceRecord) -> None:
        self.index.add_worker(record.instance_id, record.page_size)

    def remove_worker(self, instance_id: str) -> None:
        self.index.remove_worker(instance_id)
        for state in (self._inflight_blocks, self._window_peak, self._other_blocks, self._waiting):
            state.pop(instance_id, None)

    def on_kv_events(self, batch: KvEventBatch) -> None:
        self.index.apply(batch)

    def on_load(self, metrics: LoadMetrics) -> None:
        w = metrics.instance_id
        if w not in self.index.workers():
            return
        ours = self._window_peak.get(w, 0)
        self._other_blocks[w] = max(metrics.active_blocks - ours, 0)
        self._waiting[w] = metrics.waiting
        self._window_peak[w] = self._inflight_blocks.get(w, 0)

    def started(self, instance_id: str, blocks: int) -> None:
        """A request of ``blocks`` prompt blocks was sent to the worker."""
        now = self._inflight_blocks.get(instance_id, 0) + blocks
        self._inflight_blocks[instance_id] = now
        self._window_peak[instance_id] = max(self._window_peak.get(instance_id, 0), now)

    def finished(self, instance_id: str, blocks: int) -> None:
        if instance_id in self._inflight_blocks:
            self._inflight_blocks[instance_id] = max(self._inflight_blocks[instance_id] - blocks, 0)

    # --- the decision -----------------------------------------------------------------------

    def choose(self, key: str, candidates: Sequence[InstanceRecord], token_ids: Sequence[int]) -> Choice:
        """Pick one of ``candidates`` (non-empty) for a prompt; ``key`` scopes round-robin cursors."""
        if not candidates:
            raise ValueError("no candidates to choose from")
        by_id = {c.instance_id: c for c in candidates}
        if self.mode == "round-robin":
            worker = by_id[self._round_robin.choose(key, list(by_id))]
            return Choice(worker, len(token_ids) // worker.page_size, 0)
        if self.mode == "random":
            worker = by_id[choose_random(list(by_id), self._rng)]
            return Choice(worker, len(token_ids) // worker.page_size, 0)
        return self._choose_kv(by_id, token_ids)

    def _choose_kv(self, by_id: dict[str, InstanceRecord], token_ids: Sequence[int]) -> Choice:
        hashes_by_page: dict[int, list[int]] = {}
        kv_candidates: list[KvCandidate] = []
        prompt_blocks: dict[str, int] = {}
        for worker_id, record in by_id.items():
            hashes = hashes_by_page.get(record.page_size)
            if hashes is None:
                hashes = hash_token_blocks(token_ids, record.page_size)
                hashes_by_page[record.page_size] = hashes
            prompt_blocks[worker_id] = len(hashes)
            overlap = self.index.overlaps(hashes, [worker_id])[worker_id]
            kv_candidates.append(
                KvCandidate(
                    worker_id=worker_id,
                    overlap_blocks=overlap,
                    inflight_blocks=self._inflight_blocks.get(worker_id, 0),
                    other_blocks=self._other_blocks.get(worker_id, 0),
                    waiting=self._waiting.get(worker_id, 0),
                )
            )
        # Workers of one model share a page size; with mixed sizes, the blocks are not comparable and
        # the largest count stands for the prompt.
        blocks = max(prompt_blocks.values())
        best, costs = kv_choose(kv_candidates, blocks, self.overlap_weight, self._rng)
        log.debug(
            "Routed request worker=%s overlap=%d blocks=%d costs=%s",
            best.worker_id,
            best.overlap_blocks,
            blocks,
            costs,
        )
        return Choice(by_id[best.worker_id], prompt_blocks[best.worker_id], best.overlap_blocks)
