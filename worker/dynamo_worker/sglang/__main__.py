"""``python -m dynamo_worker.sglang``: serve SGLang as an aggregated, prefill or decode worker, or
(``--role encode``) compute image embeddings for them (``dynamo_worker.sglang.encode``).

Rank 0 of an engine (every single-node worker) is a full worker: ``run_worker`` connects NATS, starts
the engine, the request plane and the system server, and registers. A multinode rank > 0
(``--node-rank`` > 0) only joins the engine: it registers nothing, holds a lifeline to the leader
(``runtime.group``: the leader learns at once when this rank is gone), and serves ``/live`` until its
SGLang scheduler exits or the leader goes away (exit 1: the group restarts together) or SIGTERM arrives
(exit 0).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from dynamo_api import contract, modules

from dynamo_worker.runtime import aio
from dynamo_worker.runtime.group import run_lifeline
from dynamo_worker.runtime.listening import PortUnavailable
from dynamo_worker.runtime.settings import SettingsError, configure_logging
from dynamo_worker.runtime.system_server import SystemServer
from dynamo_worker.runtime.worker import run_worker
from dynamo_worker.sglang.args import SglangCli, WorkerArgsError, WorkerPlan, parse_worker_args
from dynamo_worker.sglang.engine import SglangEngine
from dynamo_worker.sglang.processes import kill_sglang_children, sglang_engine

log = logging.getLogger("dynamo_worker.sglang")


async def run_follower(
    plan: WorkerPlan,
    *,
    engine_factory: Callable[[Any], Any] = sglang_engine,
    kill_children: Callable[[], None] = kill_sglang_children,
    stop: asyncio.Event | None = None,
) -> int:
    """A multinode rank > 0: SGLang's constructor runs this node's schedulers and returns when they
    exit; ``/live`` answers meanwhile. SIGTERM (or ``stop``) ends it; SGLang's children go with it."""
    rt = plan.runtime
    system = SystemServer(host=rt.listen_host, port=rt.system_port)
    system.loras.leader_only = plan.server_args.node_rank  # the leader loads adapters on every rank
    if rt.system_enabled:
        try:
            await system.start()
        except PortUnavailable as e:
            log.error("%s", e)
            return 1
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    rank = plan.server_args.node_rank
    log.info("Joining a multinode SGLang engine node_rank=%s (registers nothing)", rank)
    failed: list[str] = []

    def fail(reason: str) -> None:
        failed.append(reason)
        stop.set()

    engine_task = asyncio.ensure_future(asyncio.to_thread(engine_factory, plan.server_args))
    engine_task.add_done_callback(
        lambda t: fail(
            f"SGLang schedulers of this node exited (error={None if t.cancelled() else t.exception()!r})"
        )
    )
    lifeline = asyncio.ensure_future(run_lifeline(rt.leader_system_addr, rank, fail))
    try:
        await stop.wait()
        if failed:
            log.error(
                "Leaving the multinode engine node_rank=%s: %s; the group restarts together", rank, failed[0]
            )
            return 1
        log.info("Stopping multinode follower node_rank=%s", rank)
        return 0
    finally:
        lifeline.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        kill_children()
        await system.stop()


def _multimodal_role(argv: Sequence[str]) -> str | None:
    """The value of ``--role`` when it asks for a multimodal role (encode, diffusion)."""
    args = list(argv)
    for i, a in enumerate(args):
        value = (
            a.split("=", 1)[1]
            if a.startswith("--role=")
            else args[i + 1]
            if a == "--role" and i + 1 < len(args)
            else None
        )
        if value in ("encode", "diffusion"):
            return value
        if a in ("--multimodal-encode-worker", "--image-diffusion-worker"):  # NVIDIA Dynamo's spellings
            return "encode" if a == "--multimodal-encode-worker" else "diffusion"
    return None


def main(argv: Sequence[str] | None = None, sglang: SglangCli | None = None) -> int:
    """Run the worker; 2 (with the problem and its fix on stderr, before anything starts) for a
    command line it cannot run. ``sglang``: the installed SGLang's parts (default: import them)."""
    args = list(argv if argv is not None else sys.argv[1:])
    if os.environ.get(contract.ENV_SGLANG_ENGINE, "").strip() not in ("", "sglang"):
        # The engine the image names (the CPU image: DYN_SGLANG_ENGINE=mocker), as for dynamo.sglang.
        from dynamo_worker import aliases

        return aliases.main(modules.DYNAMO_SGLANG_MODULE, args)
    role = _multimodal_role(args)
    if role == "encode":
        from dynamo_worker.sglang import encode

        return encode.main(args)
    if role == "diffusion":
        print(
            "error: --role diffusion is served by the mocker only so far (python -m dynamo_worker.mocker "
            "--role diffusion): SGLang 0.5.17's diffusion generator (sglang.multimodal_gen) needs "
            "diffusers and a real pipeline folder (no dummy weights); see tests/gpu/run_multimodal.py. "
            "Run this service with dynamo-run --engine mocker, or leave --role unset for a language worker.",
            file=sys.stderr,
        )
        return 2
    try:
        plan = parse_worker_args(args, sglang=sglang)
    except (WorkerArgsError, SettingsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    configure_logging()
    for note in plan.overrides:
        log.info(note)
    if plan.server_args.node_rank > 0:
        return asyncio.run(run_follower(plan))
    return aio.run(run_worker(SglangEngine(plan), plan.runtime))


if __name__ == "__main__":
    sys.exit(main())
