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
once in its log and in the ``dynamo_frontend_unpaired_workers`` gauge). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dynamo_worker.protocol import InstanceRecord

__all__ = ["Pair", "newest_pair", "no_pair_message", "unpaired"]


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
