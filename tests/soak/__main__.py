"""``python -m tests.soak`` (``make soak SOAK_MINUTES=30``): run the soak and print its table; exit 1 when a
request hung or was lost, the frontend's memory grew more than 10% after its warm-up, or the API key
was not required."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from tests.soak.soak import MAX_GROWTH, SoakConfig, run_soak


def parse(argv: list[str] | None) -> tuple[SoakConfig, Path | None]:
    p = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    p.add_argument(
        "--minutes", type=float, default=30.0, help="how long traffic and faults go on (default 30)"
    )
    p.add_argument(
        "--rate", type=float, default=4.0, help="requests a second, of every kind in turn (default 4)"
    )
    p.add_argument(
        "--fault-interval",
        default="30:60",
        metavar="MIN:MAX",
        help="seconds between two faults, drawn uniformly (default 30:60)",
    )
    p.add_argument("--bound-s", type=float, default=45.0, help="each request's bound for an answer or error")
    p.add_argument("--seed", type=int, default=1, help="seed of the fault times and the prompts")
    p.add_argument(
        "--window-s", type=float, default=None, help="p99 TTFT window (default 300, or 30 under 10 min)"
    )
    p.add_argument(
        "--dir", type=Path, default=None, help="folder for the logs (default: a temporary one, kept)"
    )
    p.add_argument("--json-out", type=Path, default=None, help="also write the report as JSON here")
    a = p.parse_args(argv)
    low, _, high = a.fault_interval.partition(":")
    folder = a.dir or Path(tempfile.mkdtemp(prefix="dynamo-soak-"))
    config = SoakConfig(
        folder=folder,
        minutes=a.minutes,
        rate=a.rate,
        bound_s=a.bound_s,
        interval=(float(low), float(high or low)),
        seed=a.seed,
        window_s=a.window_s,
    )
    return config, a.json_out


def main(argv: list[str] | None = None) -> int:
    config, json_out = parse(argv)
    print(f"soak: {config.minutes:g} min, logs in {config.folder}", flush=True)
    report = asyncio.run(run_soak(config))
    print("faults:\n" + report.fault_log())
    if report.odd_requests():
        print("hung or lost requests:\n" + report.odd_requests())
    print(report.table(), flush=True)
    if json_out is not None:
        body = {
            "config": {k: str(v) for k, v in asdict(config).items()},
            "sent": len(report.outcomes),
            **{s: report.count(s) for s in ("answered", "errored", "hung", "lost")},
            "faults": [
                {"at_s": f.at_s, "kind": f.kind, "target": f.target, "recovered_s": f.recovered_s}
                for f in report.faults
            ],
            "frontend_memory": report.frontend_memory(),
            "samples": [asdict(x) for x in report.samples],
            "max_growth": MAX_GROWTH,
            "ttft_p99": report.ttft_p99(),
            "key_checks": report.key_checks,
            "failures": report.failures(),
            "table": report.table(),
        }
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(body, indent=2) + "\n")
    return 1 if report.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
