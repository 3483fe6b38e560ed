"""Run a simulated worker: ``python -m dynamo_worker.mocker [SGLang, mocker and runtime flags]``."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from dynamo_worker.mocker.engine import MockerEngine
from dynamo_worker.mocker.multimodal import MockEncoder, MockImageGenerator
from dynamo_worker.mocker.scheduler_process import SchedulerProcess
from dynamo_worker.mocker.settings import MockerSettings, parse_all
from dynamo_worker.multimodal.diffusion import DiffusionService
from dynamo_worker.multimodal.encode import EncodeService
from dynamo_worker.multimodal.service import run_service
from dynamo_worker.multimodal.settings import MultimodalSettings
from dynamo_worker.profile.model import ProfileError
from dynamo_worker.runtime import aio
from dynamo_worker.runtime.aio import cancel_and_wait
from dynamo_worker.runtime.engine import EngineProcess
from dynamo_worker.runtime.group import run_lifeline
from dynamo_worker.runtime.process_watch import ProcessWatch
from dynamo_worker.runtime.settings import SettingsError, configure_logging
from dynamo_worker.runtime.worker import run_worker

log = logging.getLogger("dynamo_worker.mocker")


async def _follow(node_rank: int, leader_system_addr: str | None) -> int:
    """A non-leader rank: nothing to serve, and its share of the engine to run, simulated by a scheduler
    process as on the leader. It exits 1 when that process ends (as SGLang's follower does when its
    schedulers exit) or when its lifeline to the leader closes (``runtime.group``): either way the group
    must restart together. It says it idles only once its signal handlers are in place, so that whoever
    waits for that line may stop it at once and still see a clean exit (0)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    scheduler = SchedulerProcess(f"mocker-scheduler node_rank={node_rank}")
    scheduler.start()
    ended: list[str] = []

    def end(reason: str) -> None:
        ended.append(reason)
        stop.set()

    watch = ProcessWatch()
    watch.watch(
        [EngineProcess("scheduler", scheduler.pid)],
        lambda p, how: end(f"this rank's engine process {p.name} (pid {p.pid}) ended: {how}"),
    )
    lifeline = asyncio.create_task(run_lifeline(leader_system_addr, node_rank, end), name="group-lifeline")
    log.info(
        "Non-leader rank node_rank=%s scheduler_pid=%s: the leader serves; idling until stopped",
        node_rank,
        scheduler.pid,
    )
    try:
        await stop.wait()
    finally:
        watch.close()
        await cancel_and_wait(lifeline)
        await scheduler.stop()
    if ended:
        log.error("Non-leader rank node_rank=%s exits: %s; the group restarts together", node_rank, ended[0])
        return 1
    return 0


def _service(settings: MockerSettings, multimodal: MultimodalSettings) -> EncodeService | DiffusionService:
    model = settings.served_model_name or settings.model_path
    if not model:
        raise ValueError(f"--role {multimodal.worker_role} needs --served-model-name (or --model-path)")
    if multimodal.worker_role == "encode":
        encoder = MockEncoder(
            model,
            hidden_size=settings.mm_hidden_size,
            max_tokens=settings.mm_max_image_tokens,
            base_ms=settings.encode_base_ms,
            per_token_us=settings.encode_per_token_us,
            speedup=settings.speedup,
        )
        return EncodeService(encoder, multimodal.embedding_cache_bytes)
    generator = MockImageGenerator(
        model,
        step_ms=settings.diffusion_step_ms,
        default_steps=settings.diffusion_default_steps,
        speedup=settings.speedup,
    )
    return DiffusionService(generator, multimodal.media_output_fs_url, multimodal.media_output_http_url)


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    try:
        runtime, settings, multimodal, unknown = parse_all(argv)
    except SettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if unknown:
        log.info("Ignored flags the mocker does not simulate: %s", " ".join(unknown))
    if settings.node_rank > 0:
        return asyncio.run(_follow(settings.node_rank, runtime.leader_system_addr))
    if multimodal.worker_role != "language":
        try:
            service = _service(settings, multimodal)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return asyncio.run(run_service(service, runtime))
    try:
        engine = MockerEngine(
            settings,
            listen_host=runtime.listen_host,
            advertise_host=runtime.advertise_host,
            scheduler_process=True,
        )
    except ProfileError as e:
        print(f"error: --profile: {e}", file=sys.stderr)
        return 2
    return aio.run(run_worker(engine, runtime))


if __name__ == "__main__":
    raise SystemExit(main())
