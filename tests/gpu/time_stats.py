"""Where a disaggregated request's time goes inside SGLang, per stack: SGLang's own per-request stage
times (``--enable-request-time-stats-logging``: each finished request logs a ``ReqTimeStats(...)`` line
with its durations and bootstrap room), read from the logs of a run and summarised as medians.

usage: python3 tests/gpu/time_stats.py LOGS [LOGS ...]

Each LOGS is one stack's logs: a folder (every ``*.log`` under it) or a quoted glob (e.g. run_peers.py's
``$OUT/logs/ours-disagg`` and ``'$OUT/logs/sglang-*.log'`` for the gateway's servers). Per stack and role:

- prefill: ``bootstrap`` (arrival to the decode leg's handshake, SGLang's bootstrap queue), ``queue``
  (waiting for a prefill batch), ``forward`` (the prefill and the KV transfer, to the request's end);
- decode: ``bootstrap`` (arrival to the handshake with the prefill worker) and ``alloc_wait`` (for KV
  memory) or ``prealloc_queue``, ``transfer`` (waiting for the KV), ``queue``, ``forward``;
- ``decode - prefill arrival``: per bootstrap room, when the decode leg reached its engine after the
  prefill leg (negative: before), which is how the order and spacing of the two legs show.

A stage longer in one stack than in the other on the same engines is where the difference is; equal
stages put it outside SGLang (the frontend, the request plane, our worker's process). Pure reading:
it starts nothing.
"""

from __future__ import annotations

import glob
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

_LINE = re.compile(
    r"ReqTimeStats\((?P<body>.*)$"
)  # ReqTimeStats(rid=..., type=prefill): x_duration=1.2ms, ...
_FIELD = re.compile(r"(\w+)=([-\d.]+)(ms)?")
_ENTRY = re.compile(r"entry_time=([^,)]+)")


def parse(text: str) -> list[dict[str, float | str]]:
    """Every ``ReqTimeStats`` line of a log as {field: value} (durations in ms, entry_time as text)."""
    rows = []
    for line in text.splitlines():
        found = _LINE.search(line)
        if not found:
            continue
        body = found["body"]
        row: dict[str, float | str] = {k: float(v) for k, v, _ in _FIELD.findall(body)}
        if entry := _ENTRY.search(body):
            row["entry"] = entry[1].strip()
        if rid := re.search(r"rid=([^,)\s]+)", body):
            row["rid"] = rid[1]
        kind = re.search(r"type=(\w+)", body)
        row["role"] = kind[1] if kind and kind[1] in ("prefill", "decode") else "agg"
        rows.append(row)
    return rows


def _seconds(entry: str) -> float | None:
    """SGLang's wall-clock entry time (unix seconds, 3 decimals)."""
    try:
        return float(entry)
    except ValueError:
        return None


def summarise(rows: list[dict[str, float | str]]) -> dict[str, dict[str, float]]:
    """Per role, the median of each duration (ms); and the decode leg's arrival after the prefill's."""
    out: dict[str, dict[str, float]] = {}
    by_role: dict[str, list[dict[str, float | str]]] = defaultdict(list)
    for row in rows:
        by_role[str(row["role"])].append(row)
    for role, mine in by_role.items():
        keys = sorted(
            {k for r in mine for k, v in r.items() if k.endswith("duration") and isinstance(v, float)}
        )
        out[role] = {
            k.removesuffix("_duration"): statistics.median(float(r[k]) for r in mine if k in r) for k in keys
        }
        out[role]["requests"] = len(mine)
    arrivals: dict[float, dict[str, float]] = defaultdict(dict)
    for row in rows:
        room, entry = row.get("bootstrap_room"), row.get("entry")
        seconds = _seconds(str(entry)) if entry is not None else None
        if isinstance(room, float) and seconds is not None and row["role"] in ("prefill", "decode"):
            arrivals[room][str(row["role"])] = seconds
    gaps = [1000 * (a["decode"] - a["prefill"]) for a in arrivals.values() if len(a) == 2]
    if gaps:
        out["legs"] = {"decode - prefill arrival": statistics.median(gaps), "requests": len(gaps)}
    return out


def main(folders: list[str]) -> int:
    if not folders:
        print(__doc__)
        return 2
    for folder in folders:
        here = Path(folder)
        logs = sorted(here.rglob("*.log")) if here.is_dir() else sorted(map(Path, glob.glob(folder)))
        # dynamo-run's own log repeats every process's lines: one row per (request id, role)
        unique = {
            (r.get("rid"), r["role"]): r for log in logs for r in parse(log.read_text(errors="replace"))
        }
        rows = list(unique.values())
        print(f"== {folder}: {len(rows)} requests with SGLang time stats")
        for role, stages in summarise(rows).items():
            cells = "  ".join(f"{k} {v:.1f}" if k != "requests" else f"n={v:.0f}" for k, v in stages.items())
            print(f"  {role:8} {cells}   (ms, medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
