"""Run a simulated worker: ``python -m dynamo_worker.mocker [SGLang, mocker and runtime flags]``."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from dynamo_worker.mocker.engine import MockerEngine
from dynamo_worker.mocker.settings import parse_args
from dynamo_worker.profile.model import ProfileError
from dynamo_worker.runtime import aio
from dynamo_worker.runtime.settings import SettingsError, configure_logging
from dynamo_worker.runtime.worker import run_worker

log = logging.getLogger("dynamo_worker.mocker")


async def _idle_until_signal() -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    try:
        runtime, settings, unknown = parse_args(argv)
    except SettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if unknown:
        log.info("Ignored flags the mocker does not simulate: %s", " ".join(unknown))
    if settings.node_rank > 0:
        log.info("Non-leader rank node_rank=%s: the leader serves; idling until stopped", settings.node_rank)
        return asyncio.run(_idle_until_signal())
    try:
        engine = MockerEngine(
            settings, listen_host=runtime.listen_host, advertise_host=runtime.advertise_host
        )
    except ProfileError as e:
        print(f"error: --profile: {e}", file=sys.stderr)
        return 2
    return aio.run(run_worker(engine, runtime))


if __name__ == "__main__":
    raise SystemExit(main())
