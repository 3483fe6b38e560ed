"""The router: the state a routing decision needs (KV index, load, in-flight work) and the decision.

No I/O: discovery, KV events, snapshots and load metrics are pushed in by the frontend
(``router.feed`` wires them from NATS), and ``choose`` answers synchronously. See ``router.policy`` for
the kv cost formula and its knobs.

In kv mode every decision is remembered twice: the chosen cache's share of the request
(``Flight``, by the role the worker plays in it: on an aggregated worker its new blocks count as
prefill until the first token, its prompt blocks as decode load until it ends; on a prefill worker
only its prefill counts, until the prefill leg ends; on a decode worker its prompt blocks count as held
from dispatch to the end), and the prompt's blocks as *predicted* in the prefill cache for
``predict_ttl_s`` seconds (``KvIndex.predict``), so that the next request with the same prefix finds
it there before the worker's KV events arrive. A data-parallel worker (``dp_size`` > 1) is one
candidate per rank; the choice names the rank (``Choice.dp_rank``), which the frontend sends as
``data_parallel_rank``.

Load reports (``on_load``, each worker's ``LoadMetrics`` every 50 ms or so while it changes) bring in
what this frontend cannot see: other frontends' requests, queued prefill tokens, KV in use. A report
counts our own requests too, so what it says beyond ours is kept as *others'* load: the report less the
most this frontend had on that worker since the report before (at most what was ours in it, so ours
never count twice), and ours are added from our own counts, which change at once. Between two reports
a burst of this frontend's requests therefore sees each of its own, and another frontend's burst is
unseen for at most one report period.

LoRA: a request for an adapter (``lora_name``) is hashed in the adapter's namespace, and each cache
remembers the adapters it ran last (as many as its ``max_loras_per_batch``, the size of SGLang's GPU
pool, which evicts the least recently used) and those it runs now: ``lora_resident`` and
``lora_slots_full`` of ``router.policy``.
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Literal

from dynamo_api import contract

from dynamo_worker.protocol import InstanceRecord, KvEventBatch, LoadMetrics, hash_token_blocks
from dynamo_worker.router.index import KvIndex
from dynamo_worker.router.policy import (
    DecodeCandidate,
    KvCandidate,
    KvWeights,
    RouterMode,
    decode_rank,
    kv_choose,
)

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_PREDICT_TTL_S",
    "Choice",
    "Flight",
    "FlightRole",
    "PairFilter",
    "RoundRobin",
    "Router",
    "choose_random",
    "new_blocks",
]

FlightRole = Literal["agg", "prefill", "decode"]  # what the chosen worker does for the request
PairFilter = Callable[[str, str], bool]  # (prefill instance id, decode instance id) -> may pair

DEFAULT_PREDICT_TTL_S = 30.0
SILENT_AFTER_REQUESTS = 3  # requests a worker finishes without any KV event before we say so


# --- the round-robin and random policies, and a choice's new blocks --------------------------------


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


def new_blocks(prompt_blocks: int, overlap_blocks: int) -> int:
    """The blocks a cache must compute for a prompt: the uncached full blocks, plus one for the tail
    (the partial last block, or the last token an engine always recomputes)."""
    return max(prompt_blocks - overlap_blocks, 0) + 1


@dataclass(frozen=True)
class Choice:
    worker: InstanceRecord
    prompt_blocks: int  # full page_size blocks of the prompt on this worker
    overlap_blocks: int  # of which the kv index believes the worker caches, in any tier (0 outside kv mode)
    dp_rank: int | None = None  # the data-parallel rank to send the request to (kv mode, dp_size > 1)
    lora_name: str | None = None  # the LoRA adapter the request runs (None: the base model)

    @property
    def key(self) -> str:
        rank = self.dp_rank or 0
        return self.worker.instance_id if rank == 0 else f"{self.worker.instance_id}/dp{rank}"

    @property
    def new_blocks(self) -> int:
        return new_blocks(self.prompt_blocks, self.overlap_blocks)


class Flight:
    """One request's share of its cache's load, from ``Router.started`` to ``done`` (idempotent), by
    ``role``: ``agg``: its new blocks count as queued prefill until ``first_token``, then its prompt
    blocks as decode; ``prefill``: its new blocks count as queued prefill until the leg ends (``done``,
    or ``first_token``: the decode leg has the KV); ``decode``: its prompt blocks count as held from
    the start (SGLang's decode worker reserves them before the transfer) to ``done``."""

    def __init__(self, router: Router, choice: Choice, role: FlightRole = "agg") -> None:
        self._router = router
        self.choice = choice
        self.role: FlightRole = role
        self._prefilling = role != "decode"
        self._done = False
        c = choice
        if role == "decode":
            router._add(c, decode=c.prompt_blocks, blocks=c.prompt_blocks, requests=1)
        else:
            router._add(c, prefill=c.new_blocks, prefilling=1, blocks=c.prompt_blocks, requests=1)

    def first_token(self) -> None:
        """The prefill is over: the request now decodes."""
        if self.role == "prefill":
            self.done()
        elif self._prefilling and not self._done:
            self._prefilling = False
            c = self.choice
            self._router._add(c, prefill=-c.new_blocks, prefilling=-1, decode=c.prompt_blocks)

    def done(self) -> None:
        if self._done:
            return
        self._done = True
        c = self.choice
        if self._prefilling:
            self._router._add(c, prefill=-c.new_blocks, prefilling=-1)
        else:
            self._router._add(c, decode=-c.prompt_blocks)
        self._router._finished(c, self.role)


@dataclass
class _WorkerLoad:
    """One worker's load as this frontend knows it: its own requests there (exact, at once), the most
    of each since the last load report, and what that report said beyond ours (``others_*``)."""

    blocks: int = 0  # prompt blocks of our requests holding KV there
    prefill: int = 0  # new blocks of our requests not prefilled yet
    prefill_whole: int = 0  # whole prompt blocks of those (what a bootstrap queue reports of them)
    prefilling: int = 0  # our requests not prefilled yet
    requests: int = 0
    peak_blocks: int = 0
    peak_prefill: int = 0
    peak_prefill_whole: int = 0
    peak_prefilling: int = 0
    peak_requests: int = 0
    others_blocks: int = 0  # KV blocks in use beyond ours
    others_prefill: int = 0  # blocks of prefill queued beyond ours
    others_requests: int = 0  # requests running or queued beyond ours

    def add(self, blocks: int, prefill: int, prefill_whole: int, prefilling: int, requests: int) -> None:
        self.blocks = max(self.blocks + blocks, 0)
        self.prefill = max(self.prefill + prefill, 0)
        self.prefill_whole = max(self.prefill_whole + prefill_whole, 0)
        self.prefilling = max(self.prefilling + prefilling, 0)
        self.requests = max(self.requests + requests, 0)
        self.peak_blocks = max(self.peak_blocks, self.blocks)
        self.peak_prefill = max(self.peak_prefill, self.prefill)
        self.peak_prefill_whole = max(self.peak_prefill_whole, self.prefill_whole)
        self.peak_prefilling = max(self.peak_prefilling, self.prefilling)
        self.peak_requests = max(self.peak_requests, self.requests)

    def report(self, metrics: LoadMetrics, page_size: int) -> None:
        """Take a load report: what it says beyond the most that was ours since the one before. A prefill
        worker's report counts the requests in its bootstrap queue whole (SGLang matches them against
        its cache only when they leave it), so while it has one, ours count whole too: else each of our
        requests waiting there would come back as its cached blocks of some other frontend's prefill."""
        m = metrics
        self.others_blocks = max(m.active_blocks - self.peak_blocks, 0)
        queued = -(-m.waiting_prefill_tokens // page_size)
        if m.waiting_prefill_tokens:
            ours = self.peak_prefill_whole if m.bootstrap_queue else self.peak_prefill
            self.others_prefill = max(queued - ours, 0)
        else:  # a worker that reports no token count (an older one): one block per waiting request
            self.others_prefill = max(m.waiting - self.peak_prefilling, 0)
        self.others_requests = max(m.running + m.waiting - self.peak_requests, 0)
        self.peak_blocks, self.peak_prefill = self.blocks, self.prefill
        self.peak_prefill_whole = self.prefill_whole
        self.peak_prefilling, self.peak_requests = self.prefilling, self.requests


class Router:
    def __init__(
        self,
        mode: RouterMode,
        overlap_weight: float = KvWeights.overlap_weight,
        rng: random.Random | None = None,
        *,
        weights: KvWeights | None = None,
        predict_ttl_s: float = DEFAULT_PREDICT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.mode: RouterMode = mode
        self.weights = weights or KvWeights(overlap_weight=overlap_weight)
        self.predict_ttl_s = predict_ttl_s
        self.index = KvIndex()
        self._clock = clock
        self._rng = rng or random.Random()
        self._round_robin = RoundRobin()
        self._records: dict[str, InstanceRecord] = {}
        # per cache key (worker, or worker/dpN): this frontend's requests in flight there
        self._decode_blocks: dict[str, int] = {}
        self._prefill_blocks: dict[str, int] = {}
        self._requests: dict[str, int] = {}
        # per worker: ours, and what its load reports say beyond ours
        self._load: dict[str, _WorkerLoad] = {}
        self._finished_count: dict[str, int] = {}
        self._silent_reported: set[str] = set()
        # per cache key: the adapters it ran last (most recent at the end), and runs now (None: base)
        self._lora_recent: dict[str, OrderedDict[str | None, None]] = {}
        self._lora_running: dict[str, dict[str | None, int]] = {}
        self.on_worker_added: Callable[[InstanceRecord], None] | None = None  # e.g. ask for a snapshot

    @property
    def overlap_weight(self) -> float:
        return self.weights.overlap_weight

    # --- state fed from the outside -----------------------------------------------------------

    def add_worker(self, record: InstanceRecord) -> None:
        new = record.instance_id not in self._records
        self._records[record.instance_id] = record
        self.index.add_worker(record.instance_id, record.page_size, record.dp_size)
        if new and self.on_worker_added is not None:
            self.on_worker_added(record)

    def remove_worker(self, instance_id: str) -> None:
        self.index.remove_worker(instance_id)
        self._records.pop(instance_id, None)
        self._load.pop(instance_id, None)
        self._finished_count.pop(instance_id, None)
        prefix = instance_id + "/"
        for per_key in (
            self._decode_blocks,
            self._prefill_blocks,
            self._requests,
            self._lora_recent,
            self._lora_running,
        ):
            for key in [k for k in per_key if k == instance_id or k.startswith(prefix)]:
                del per_key[key]

    def on_kv_events(self, batch: KvEventBatch) -> None:
        self.index.apply(batch)

    def on_load(self, metrics: LoadMetrics) -> None:
        record = self._records.get(metrics.instance_id)
        if record is None:
            return
        self._load.setdefault(record.instance_id, _WorkerLoad()).report(metrics, record.page_size)

    def load_of(self, instance_id: str) -> dict[str, int]:
        """What this frontend counts on a worker now (ours and others'), for logs and tests."""
        load = self._load.get(instance_id, _WorkerLoad())
        return {f.name: getattr(load, f.name) for f in fields(load) if not f.name.startswith("peak")}

    def started(self, choice: Choice, role: FlightRole = "agg") -> Flight:
        """A request was sent as ``choice`` says, the worker serving it as ``role``; call
        ``first_token`` and ``done`` on the result."""
        flight = Flight(self, choice, role)
        self._lora_started(choice)
        return flight

    def _lora_started(self, choice: Choice) -> None:
        lora = choice.worker.lora
        if lora is None or choice.worker.instance_id not in self._records:
            return
        recent = self._lora_recent.setdefault(choice.key, OrderedDict())
        recent[choice.lora_name] = None
        recent.move_to_end(choice.lora_name)
        while len(recent) > lora.max_loras_per_batch:
            recent.popitem(last=False)
        running = self._lora_running.setdefault(choice.key, {})
        running[choice.lora_name] = running.get(choice.lora_name, 0) + 1

    def _lora_finished(self, choice: Choice) -> None:
        running = self._lora_running.get(choice.key)
        if running is None or choice.lora_name not in running:
            return
        running[choice.lora_name] -= 1
        if running[choice.lora_name] <= 0:
            del running[choice.lora_name]

    def lora_residency(self, key: str, record: InstanceRecord, lora_name: str | None) -> tuple[bool, bool]:
        """(resident, slots_full) of a cache for a request of ``lora_name`` (see the module docstring)."""
        state = record.lora
        if state is None:
            return True, False
        running = self._lora_running.get(key, {})
        full = lora_name not in running and len(running) >= state.max_loras_per_batch
        if lora_name is None:
            return True, full
        pinned = any(a.name == lora_name and a.pinned for a in state.adapters)
        return pinned or lora_name in self._lora_recent.get(key, ()), full

    def _add(
        self,
        choice: Choice,
        *,
        prefill: int = 0,
        prefilling: int = 0,
        decode: int = 0,
        blocks: int = 0,
        requests: int = 0,
    ) -> None:
        key, w = choice.key, choice.worker.instance_id
        if w not in self._records:
            return  # the worker left (its state went with it), or was never known
        for state, delta in (
            (self._prefill_blocks, prefill),
            (self._decode_blocks, decode),
            (self._requests, requests),
        ):
            if delta:
                state[key] = max(state.get(key, 0) + delta, 0)
        whole = prefilling * (choice.prompt_blocks + 1)  # as new_blocks counts: the tail block too
        self._load.setdefault(w, _WorkerLoad()).add(blocks, prefill, whole, prefilling, requests)

    def _finished(self, choice: Choice, role: FlightRole) -> None:
        w = choice.worker.instance_id
        if w not in self._records:
            return
        self._add(choice, blocks=-choice.prompt_blocks, requests=-1)
        self._lora_finished(choice)
        # a decode worker caches nothing for routing (SGLang's decode radix cache is off by default)
        if self.mode == "kv" and choice.prompt_blocks > 0 and role != "decode":
            n = self._finished_count[w] = self._finished_count.get(w, 0) + 1
            if (
                n >= SILENT_AFTER_REQUESTS
                and w not in self._silent_reported
                and not self.index.events_seen.get(w)
            ):
                self._silent_reported.add(w)
                log.warning(
                    "Worker publishes no KV events worker=%s component=%s address=%s finished_requests=%d: "
                    "this frontend routes on KV cache (--router-mode kv) but can only predict this worker's "
                    "cache, not see it. Start its SGLang engine with --kv-events-config "
                    f'\'{{"publisher": "zmq", "endpoint": "tcp://*:{contract.KV_EVENTS_PORT}"}}\' '
                    "(the operator and dynamo-run add one when the graph's frontend runs --router-mode kv), "
                    "or use --router-mode round-robin.",
                    w,
                    choice.worker.component,
                    choice.worker.address,
                    n,
                )

    def silent_workers(self) -> list[str]:
        """Workers this frontend has reported as publishing no KV events."""
        return sorted(self._silent_reported)

    # --- the decision -----------------------------------------------------------------------

    def choose(
        self,
        key: str,
        candidates: Sequence[InstanceRecord],
        token_ids: Sequence[int],
        lora_name: str | None = None,
    ) -> Choice:
        """Pick one of ``candidates`` (non-empty) for a prompt, of the LoRA adapter ``lora_name`` (None:
        the base model; the candidates are workers that hold it); ``key`` scopes round-robin cursors."""
        if not candidates:
            raise ValueError("no candidates to choose from")
        by_id = {c.instance_id: c for c in candidates}
        # direct: what a frontend routes itself, the picker's pin aside (frontend.serving.direct)
        if self.mode in ("round-robin", "direct"):
            worker = by_id[self._round_robin.choose(key, list(by_id))]
            return Choice(worker, len(token_ids) // worker.page_size, 0, lora_name=lora_name)
        if self.mode == "random":
            worker = by_id[choose_random(list(by_id), self._rng)]
            return Choice(worker, len(token_ids) // worker.page_size, 0, lora_name=lora_name)
        return self._choose_kv(by_id, token_ids, lora_name)

    def choose_pair(
        self,
        key: str,
        prefill: Sequence[InstanceRecord],
        decode: Sequence[InstanceRecord],
        token_ids: Sequence[int],
        allowed: PairFilter | None = None,
        lora_name: str | None = None,
    ) -> tuple[Choice, Choice]:
        """A prefill and a decode worker for one disaggregated request, as one decision: only pairs that
        ``allowed`` accepts (all when None; at least one must be); in kv mode the prefill worker by the
        kv cost among those whose best allowed decode partner has room for the prompt's KV (all, when
        none has), then that partner (``policy.decode_rank``). ``key`` scopes round-robin cursors."""
        partners = {
            p.instance_id: [d for d in decode if allowed is None or allowed(p.instance_id, d.instance_id)]
            for p in prefill
        }
        firsts = [p for p in prefill if partners[p.instance_id]]
        if not firsts:
            raise ValueError("no allowed prefill/decode pair to choose from")
        if self.mode != "kv":
            first = self.choose(f"{key}/prefill", firsts, token_ids, lora_name)
            second = self.choose(f"{key}/decode", partners[first.worker.instance_id], token_ids, lora_name)
            return first, second
        prompt = max(len(token_ids) // d.page_size for d in decode)
        best = {p.instance_id: self._best_decode(partners[p.instance_id], prompt) for p in firsts}
        roomy = [p for p in firsts if best[p.instance_id][0].has_room(prompt)]
        first = self._choose_kv({p.instance_id: p for p in roomy or firsts}, token_ids, lora_name)
        chosen, record = best[first.worker.instance_id]
        rank = chosen.dp_rank if record.dp_size > 1 else None
        return first, Choice(record, len(token_ids) // record.page_size, 0, rank, lora_name=lora_name)

    def _best_decode(
        self, decode: Sequence[InstanceRecord], prompt_blocks: int
    ) -> tuple[DecodeCandidate, InstanceRecord]:
        """The decode cache ``policy.decode_rank`` puts first (ties broken at random)."""
        ranked: list[tuple[tuple[bool, float], DecodeCandidate, InstanceRecord]] = []
        for record in decode:
            w, share = record.instance_id, record.dp_size
            load = self._load.get(w, _WorkerLoad())
            capacity = record.total_kv_blocks // share if record.total_kv_blocks else None
            for rank in range(share):
                key = Choice(record, 0, 0, rank).key
                c = DecodeCandidate(
                    worker_id=w,
                    dp_rank=rank,
                    held_blocks=self._decode_blocks.get(key, 0) + load.others_blocks // share,
                    capacity_blocks=capacity,
                )
                ranked.append((decode_rank(c, prompt_blocks, self.weights), c, record))
        top = min(r[0] for r in ranked)
        tied = sorted((r for r in ranked if r[0] == top), key=lambda r: r[1].key)
        _, candidate, record = self._rng.choice(tied)
        return candidate, record

    def _choose_kv(
        self, by_id: dict[str, InstanceRecord], token_ids: Sequence[int], lora_name: str | None
    ) -> Choice:
        now = self._clock()
        self.index.expire(now)
        hashes_by_page: dict[int, list[int]] = {}
        kv_candidates: list[KvCandidate] = []
        prompt_blocks: dict[str, int] = {}
        for worker_id, record in by_id.items():
            hashes = hashes_by_page.get(record.page_size)
            if hashes is None:
                hashes = hash_token_blocks(token_ids, record.page_size, lora_name=lora_name)
                hashes_by_page[record.page_size] = hashes
            prompt_blocks[worker_id] = len(hashes)
            ranks = range(record.dp_size)
            overlaps = self.index.tier_overlaps(hashes, [(worker_id, r) for r in ranks])
            share = record.dp_size
            load = self._load.get(worker_id, _WorkerLoad())
            capacity = record.total_kv_blocks // share if record.total_kv_blocks else None
            for rank in ranks:
                c = Choice(record, len(hashes), 0, rank)
                held = self.index.block_count(worker_id, rank, predicted=True)  # on its GPU
                tiers = overlaps[(worker_id, rank)]
                resident, slots_full = self.lora_residency(c.key, record, lora_name)
                kv_candidates.append(
                    KvCandidate(
                        worker_id=worker_id,
                        dp_rank=rank,
                        overlap_blocks=tiers.gpu,
                        host_blocks=tiers.host,
                        disk_blocks=tiers.disk,
                        prefill_blocks=self._prefill_blocks.get(c.key, 0) + load.others_prefill // share,
                        decode_blocks=self._decode_blocks.get(c.key, 0) + load.others_blocks // share,
                        requests=self._requests.get(c.key, 0) + load.others_requests // share,
                        free_blocks=max(capacity - held, 0) if capacity is not None else None,
                        capacity_blocks=capacity,
                        lora_resident=resident,
                        lora_slots_full=slots_full,
                    )
                )
        # Workers of one model share a page size; with mixed sizes, the blocks are not comparable and
        # the largest count stands for the prompt.
        blocks = max(prompt_blocks.values())
        best, costs = kv_choose(kv_candidates, blocks, self.weights, self._rng)
        record = by_id[best.worker_id]
        self.index.predict(
            (best.worker_id, best.dp_rank), hashes_by_page[record.page_size], now + self.predict_ttl_s
        )
        log.debug(
            "Routed request worker=%s dp_rank=%d overlap=%d host=%d disk=%d blocks=%d costs=%s",
            best.worker_id,
            best.dp_rank,
            best.overlap_blocks,
            best.host_blocks,
            best.disk_blocks,
            blocks,
            costs,
        )
        return Choice(
            record,
            prompt_blocks[best.worker_id],
            best.overlap_blocks + best.host_blocks + best.disk_blocks,
            best.dp_rank if record.dp_size > 1 else None,
            lora_name,
        )
