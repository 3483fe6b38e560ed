"""``python -m dynamo_worker.bench --url URL --model NAME [...]``: one load run, a table, optional JSON."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

import orjson

from dynamo_worker.bench import run_bench
from dynamo_worker.bench.settings import BenchSettings
from dynamo_worker.bench.stats import format_report
from dynamo_worker.runtime.settings import SettingsError, configure_logging


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = BenchSettings.parse(argv)
    except SettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    configure_logging()
    try:
        report = asyncio.run(run_bench(settings))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    load = f"concurrency={settings.concurrency}" if settings.mode == "closed" else f"rate={settings.rate}/s"
    print(
        format_report(
            report, f"{settings.url} model={settings.model} {settings.workload} {settings.mode} {load}"
        )
    )
    if settings.json_out is not None:
        settings.json_out.parent.mkdir(parents=True, exist_ok=True)
        body = {"settings": settings.model_dump(mode="json", exclude={"api_key"}), "report": report.to_dict()}
        settings.json_out.write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2))
        print(f"wrote {settings.json_out}")
    return 0 if report.completed else 1


if __name__ == "__main__":
    sys.exit(main())
