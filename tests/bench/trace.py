"""A request trace in the Mooncake format (FAST'25): what to send and when, and what any router could find.

Pure functions and plain data, standard library only (``tests/gpu/run_peers.py`` imports it on a GPU
machine): no clock, no I/O but ``load``. One JSON object a line: ``timestamp`` (ms from the trace's
start), ``input_length``, ``output_length`` and ``hash_ids``, one id per block of ``BLOCK_TOKENS``
prompt tokens; two requests whose leading ids are equal share that prefix.

- ``parse`` / ``load``: the requests, in the trace's order.
- ``window``: a slice by start offset and duration (seconds of trace time) or count, its timestamps
  rebased to its first request; ``scale``: the same requests at ``speedup`` times the trace's rate.
- ``BlockTokens``: each hash id's block of token ids, drawn from a generator seeded by the id alone, so
  equal ids give equal tokens in every process and for every stack; ``prompt_ids`` joins a request's
  blocks and trims the last to its ``input_length``.
- ``cacheable_share``: of the window's prompt tokens, those in leading blocks an earlier request of the
  window already sent: the most a cache that keeps everything (one engine of unbounded memory) finds.
- ``goodput``: how many requests met the SLO (TTFT and ITL, each per request).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

__all__ = [
    "BLOCK_TOKENS",
    "ITL_SLO_S",
    "TTFT_SLO_S",
    "BlockTokens",
    "TraceError",
    "TraceRequest",
    "cacheable_share",
    "goodput",
    "load",
    "parse",
    "prompt_ids",
    "request_itl_s",
    "scale",
    "window",
]

BLOCK_TOKENS = 512  # the Mooncake traces' tokens per hash id
TTFT_SLO_S, ITL_SLO_S = 2.0, 0.025  # the SLO NVIDIA Dynamo publishes its trace replays with


class TraceError(ValueError):
    """A line of the trace is not a request this module can replay."""


@dataclass(frozen=True)
class TraceRequest:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def parse(lines: Iterable[str], block: int = BLOCK_TOKENS) -> list[TraceRequest]:
    """The requests of the trace's lines (blank lines skipped). Raises ``TraceError`` naming the line
    when a field is missing or the hash ids do not cover the input (one id per ``block`` tokens)."""
    out: list[TraceRequest] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            req = TraceRequest(
                float(row["timestamp"]),
                int(row["input_length"]),
                int(row["output_length"]),
                tuple(int(h) for h in row["hash_ids"]),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise TraceError(f"line {number}: not a trace request ({type(e).__name__}: {e})") from e
        if req.input_length < 1 or req.output_length < 1:
            raise TraceError(f"line {number}: input_length and output_length must be >= 1")
        if len(req.hash_ids) * block < req.input_length:
            raise TraceError(
                f"line {number}: {len(req.hash_ids)} hash ids of {block} tokens do not cover "
                f"input_length {req.input_length}"
            )
        out.append(req)
    return out


def load(path: str | Path, block: int = BLOCK_TOKENS) -> list[TraceRequest]:
    with open(path, encoding="utf-8") as f:
        return parse(f, block)


def window(
    requests: Sequence[TraceRequest],
    *,
    start_s: float = 0.0,
    duration_s: float | None = None,
    count: int | None = None,
) -> list[TraceRequest]:
    """The requests from ``start_s`` seconds after the trace's first one, for ``duration_s`` seconds
    and at most ``count`` of them (either bound may be None), timestamps rebased to the first taken."""
    if not requests:
        return []
    origin = requests[0].timestamp_ms + 1000 * start_s
    end = origin + 1000 * duration_s if duration_s is not None else float("inf")
    taken = [r for r in requests if origin <= r.timestamp_ms < end][:count]
    if not taken:
        return []
    first = taken[0].timestamp_ms
    return [replace(r, timestamp_ms=r.timestamp_ms - first) for r in taken]


def scale(requests: Sequence[TraceRequest], speedup: float) -> list[TraceRequest]:
    """The same requests sent ``speedup`` times as fast (2: at half the trace's gaps)."""
    if speedup <= 0:
        raise ValueError("speedup must be > 0")
    return [replace(r, timestamp_ms=r.timestamp_ms / speedup) for r in requests]


class BlockTokens:
    """Each hash id's ``block`` token ids, uniform in ``[low, high)``, from a generator seeded by
    (``salt``, the id): the same in every process (``random.Random`` with an int seed is)."""

    def __init__(self, low: int, high: int, block: int = BLOCK_TOKENS, salt: int = 0) -> None:
        if not 0 <= low < high:
            raise ValueError("need 0 <= low < high")
        self.population = range(low, high)
        self.block, self.salt = block, salt
        self._cache: dict[int, tuple[int, ...]] = {}

    def ids(self, hash_id: int) -> tuple[int, ...]:
        found = self._cache.get(hash_id)
        if found is None:
            rng = random.Random(self.salt * 1_000_003 + hash_id)
            found = self._cache[hash_id] = tuple(rng.choices(self.population, k=self.block))
        return found


def prompt_ids(request: TraceRequest, blocks: BlockTokens) -> list[int]:
    """The request's prompt: its hash ids' blocks in order, the last trimmed to ``input_length``."""
    out: list[int] = []
    for h in request.hash_ids:
        if len(out) >= request.input_length:
            break
        out.extend(blocks.ids(h))
    del out[request.input_length :]
    return out


def cacheable_share(requests: Sequence[TraceRequest], block: int = BLOCK_TOKENS) -> float:
    """The share of the requests' prompt tokens that lie in leading blocks an earlier request already
    sent (a request's last block counts with the tokens it has). 0 for no requests."""
    seen: set[int] = set()
    total = found = 0
    for r in requests:
        hit = True
        for i, h in enumerate(r.hash_ids):
            tokens = min(block, r.input_length - i * block)
            if tokens <= 0:
                break
            hit = hit and h in seen
            found += tokens if hit else 0
            seen.add(h)
        total += r.input_length
    return found / total if total else 0.0


def request_itl_s(first_s: float, end_s: float, output_tokens: int) -> float | None:
    """A request's inter-token latency, the mean gap after its first token (aiperf's per-request
    ITL); None for a single token."""
    return (end_s - first_s) / (output_tokens - 1) if output_tokens > 1 else None


def goodput(
    samples: Iterable[tuple[float, float | None]], ttft_s: float = TTFT_SLO_S, itl_s: float = ITL_SLO_S
) -> int:
    """How many completed requests, each ``(ttft, itl or None)`` in seconds, met both targets (a
    request of one token has no ITL and meets that one)."""
    return sum(1 for ttft, itl in samples if ttft <= ttft_s and (itl is None or itl <= itl_s))
