"""Which prefill and decode workers may serve one disaggregated request together: those of one revision.

A worker's revision (``InstanceRecord.revision``) names what fixes its KV layout and its model: the
operator gives the prefill and decode pods of one rollout step the same one, computed from their image
and the flags that shape the KV cache (``--page-size``, the model, tensor parallelism, ...); a worker
started by hand derives one from its model, model card and page size. A prefill and a decode worker of
different revisions would hand each other KV caches of different layouts (garbage, or a hang in
SGLang), so they are never paired.

While a rollout runs, two revisions serve at once. Requests go to the newest revision that has both
roles (``newest_pair``): the one whose workers started last, judged by the earliest ``started_at`` of
its workers, so that one restarted worker of an old revision does not make that revision new. A
revision with one role only gets no disaggregated traffic: ``unpaired`` names it (the registry says so
once in its log and in the ``dynamo_frontend_unpaired_workers`` gauge).

Warm pairs: the first KV transfer between a prefill and a decode worker opens their connection (on
GPUs, seconds: NIXL's first transfer), so the frontend sends a tiny request through every new
combination before user traffic (``serving.warmup``) and ``WarmPairs`` records which combinations have
moved KV. ``routable_pair`` keeps user requests on warm combinations while there is one: the newest
revision that has a warm combination, and only its warm combinations; with none warm anywhere, the
newest revision and any combination (warming is never a reason to refuse a request). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from dynamo_worker.protocol import InstanceRecord

__all__ = [
    "Pair",
    "PairKey",
    "PairState",
    "WarmPairs",
    "newest_pair",
    "no_pair_message",
    "routable_pair",
    "unpaired",
]

PairKey = tuple[str, str]  # (prefill instance id, decode instance id)
PairState = Literal["warming", "warm", "failed"]


@dataclass(frozen=True)
class Pair:
    """The workers of one revision that a disaggregated request may use."""

    revision: str | None
    prefill: tuple[InstanceRecord, ...]
    decode: tuple[InstanceRecord, ...]


def _by_revision(
    prefill: Iterable[InstanceRecord], decode: Iterable[InstanceRecord]
) -> dict[str | None, tuple[list[InstanceRecord], list[InstanceRecord]]]:
    out: dict[str | None, tuple[list[InstanceRecord], list[InstanceRecord]]] = {}
    for w in prefill:
        out.setdefault(w.revision, ([], []))[0].append(w)
    for w in decode:
        out.setdefault(w.revision, ([], []))[1].append(w)
    return out


def _age(workers: Iterable[InstanceRecord]) -> float:
    """When a revision started serving: its earliest worker start (unknown counts as oldest)."""
    return min((w.started_at or 0.0 for w in workers), default=0.0)


def newest_pair(prefill: Sequence[InstanceRecord], decode: Sequence[InstanceRecord]) -> Pair | None:
    """The newest revision with at least one prefill and one decode worker among those given, or None."""
    complete = [(rev, p, d) for rev, (p, d) in _by_revision(prefill, decode).items() if p and d]
    if not complete:
        return None
    rev, p, d = max(complete, key=lambda c: (_age([*c[1], *c[2]]), c[0] or ""))
    return Pair(rev, tuple(p), tuple(d))


def revisions_newest_first(prefill: Sequence[InstanceRecord], decode: Sequence[InstanceRecord]) -> list[Pair]:
    """Every revision with both roles, the newest first (``newest_pair``'s order)."""
    complete = [(rev, p, d) for rev, (p, d) in _by_revision(prefill, decode).items() if p and d]
    complete.sort(key=lambda c: (_age([*c[1], *c[2]]), c[0] or ""), reverse=True)
    return [Pair(rev, tuple(p), tuple(d)) for rev, p, d in complete]


class WarmPairs:
    """Which prefill/decode combinations have moved KV between them (``warm``), are being warmed up or
    failed to. Pure state; ``serving.warmup`` changes it, and a user request that got its KV marks its
    combination warm too."""

    def __init__(self) -> None:
        self._state: dict[PairKey, PairState] = {}

    def state(self, prefill: str, decode: str) -> PairState | None:
        return self._state.get((prefill, decode))

    def set(self, prefill: str, decode: str, state: PairState) -> None:
        self._state[(prefill, decode)] = state

    def is_warm(self, prefill: str, decode: str) -> bool:
        return self._state.get((prefill, decode)) == "warm"

    def pairs(self) -> list[PairKey]:
        return list(self._state)

    def forget(self, key: PairKey) -> None:
        self._state.pop(key, None)


def routable_pair(
    pair: Pair | None,
    prefill: Sequence[InstanceRecord],
    decode: Sequence[InstanceRecord],
    is_warm: Callable[[str, str], bool],
) -> tuple[Pair, Callable[[str, str], bool] | None] | None:
    """Where a user request may go (see the module docstring): a pair of workers and the filter of its
    combinations (None: any). ``pair`` is the newest one of ``prefill`` and ``decode`` when the caller
    has it cached (else None: computed)."""
    pairs = [pair] if pair is not None else revisions_newest_first(prefill, decode)[:1]
    if not pairs:
        return None
    first = pairs[0]
    warm = _warm_keys(first, is_warm)
    if len(warm) == len(first.prefill) * len(first.decode):
        return first, None  # the steady state: every combination is warm
    if not warm:  # the newest revision is not warm yet: an older one that is, if any
        for older in revisions_newest_first(prefill, decode)[1:]:
            if warm := _warm_keys(older, is_warm):
                return older, _member(warm)
        return first, None
    return first, _member(warm)


def _warm_keys(pair: Pair, is_warm: Callable[[str, str], bool]) -> frozenset[PairKey]:
    return frozenset(
        (p.instance_id, d.instance_id)
        for p in pair.prefill
        for d in pair.decode
        if is_warm(p.instance_id, d.instance_id)
    )


def _member(keys: frozenset[PairKey]) -> Callable[[str, str], bool]:
    return lambda prefill, decode: (prefill, decode) in keys


def unpaired(
    prefill: Sequence[InstanceRecord], decode: Sequence[InstanceRecord]
) -> dict[tuple[str | None, str], int]:
    """Per (revision, role), the workers of a revision that has no worker of the other role."""
    out: dict[tuple[str | None, str], int] = {}
    for rev, (p, d) in _by_revision(prefill, decode).items():
        if p and not d:
            out[(rev, "prefill")] = len(p)
        elif d and not p:
            out[(rev, "decode")] = len(d)
    return out


def _revisions(workers: Sequence[InstanceRecord]) -> str:
    return ", ".join(sorted({w.revision or "none" for w in workers}))


def no_pair_message(model: str, prefill: Sequence[InstanceRecord], decode: Sequence[InstanceRecord]) -> str:
    """Why no prefill and decode worker of ``model`` can be paired, and what to do."""
    return (
        f"Model '{model}' has prefill workers of revision(s) {_revisions(prefill)} and decode workers of "
        f"revision(s) {_revisions(decode)}, and a prefill and a decode worker are paired only when they "
        "share a revision (the same KV layout and model). This is the middle of a rollout or a graph whose "
        "prefill and decode workers differ in what fixes the KV layout; retry shortly, and if it persists "
        "give both the same model, --page-size and image."
    )
