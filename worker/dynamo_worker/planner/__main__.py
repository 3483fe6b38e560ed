"""Run the planner: ``python -m dynamo_worker.planner [flags]`` (``--help`` lists them)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from dynamo_worker.planner.kube import GraphClient, KubeError
from dynamo_worker.planner.localgraph import LocalGraph
from dynamo_worker.planner.run import Planner, serve_metrics
from dynamo_worker.planner.settings import PlannerSettings, parse_args
from dynamo_worker.planner.step import GraphError
from dynamo_worker.profile.model import ProfileError
from dynamo_worker.runtime.listening import PortUnavailable
from dynamo_worker.runtime.settings import SettingsError, configure_logging
from dynamo_worker.runtime.worker import close_nats

log = logging.getLogger("dynamo_worker.planner")


async def _run(settings: PlannerSettings, ignored: list[str]) -> int:
    planner = Planner(settings, ignored_config_fields=ignored)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner, _ = await serve_metrics(planner.metrics.registry, settings.metrics_host, settings.metrics_port)
    nc = None
    try:
        if settings.mode == "load":
            import nats

            from dynamo_worker.planner.loadfeed import LoadFeed

            if not settings.nats_server:
                raise SettingsError("load mode needs --nats-server (or NATS_SERVER) for the workers' load")
            nc = await nats.connect(settings.nats_server, connect_timeout=5, max_reconnect_attempts=-1)
            planner.load_feed = await LoadFeed(
                nc, settings.dynamo_namespace or f"{settings.namespace}-{settings.graph}"
            ).start()
        source: LocalGraph | GraphClient = (
            LocalGraph(settings.graph_file, settings.namespace, settings.graph)
            if settings.graph_file
            else GraphClient(settings.namespace, settings.graph, settings.kubeconfig)
        )
        async with source as graph:
            await planner.run(stop, graph)
    finally:
        if planner.load_feed is not None:
            await planner.load_feed.stop()
        if nc is not None:
            await close_nats(nc)
        await runner.cleanup()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    try:
        settings, ignored = parse_args(argv)
        return asyncio.run(_run(settings, ignored))
    except (SettingsError, ProfileError, KubeError, GraphError, PortUnavailable, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
