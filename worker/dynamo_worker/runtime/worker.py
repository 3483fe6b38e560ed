"""Serve an ``Engine`` as a worker of a graph: the lifecycle every worker process shares.

More: docs/module-notes.md (dynamo_worker.runtime.worker)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import signal
import time
from collections.abc import Callable, Sequence

import nats
import nats.errors
from dynamo_api.errors import DynamoError
from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription
from prometheus_client import CollectorRegistry, Counter, Gauge

from dynamo_worker.protocol import AllBlocksCleared, InstanceRecord, KvEvent, LoraState
from dynamo_worker.runtime.aio import cancel_and_wait
from dynamo_worker.runtime.discovery import DiscoveryError, Registration, register
from dynamo_worker.runtime.engine import Engine, EngineInfo, EngineProcess, LoadSnapshot
from dynamo_worker.runtime.events import KvEventPublisher, LoadPublisher, serve_kv_snapshots
from dynamo_worker.runtime.group import LIFELINE_PATH, GroupLifeline
from dynamo_worker.runtime.health import HealthMonitor
from dynamo_worker.runtime.lora import LoraManager
from dynamo_worker.runtime.modelcard import ModelCardError, publish_model_card
from dynamo_worker.runtime.process_watch import ProcessWatch
from dynamo_worker.runtime.recovery import EXIT_ENGINE_DIED, RestartBudget, decide
from dynamo_worker.runtime.request_plane import RequestMetrics, RequestServer
from dynamo_worker.runtime.settings import RuntimeSettings, redact_url
from dynamo_worker.runtime.system_server import SystemServer

__all__ = [
    "EXIT_ENGINE_DIED",
    "NATS_CONNECT_TIMEOUT_S",
    "Worker",
    "WorkerStartError",
    "connect_nats",
    "redact_url",
    "run_worker",
    "worker_revision",
]

log = logging.getLogger(__name__)

NATS_CONNECT_TIMEOUT_S = 30.0


async def close_nats(nc: NATS, within_s: float = 5.0) -> None:
    """Close ``nc`` within ``within_s``, its reconnect attempts included. nats-py's ``close`` cancels a
    running reconnect attempt once; an attempt that is inside a connect can absorb that cancellation
    and go on retrying a broker that is gone (forever: we reconnect without limit), so the cancellation
    is repeated until the attempt has ended."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
        async with asyncio.timeout_at(deadline):
            await nc.close()
    reconnecting = nc._reconnection_task  # nats-py keeps no public handle on it
    while reconnecting is not None and not reconnecting.done() and loop.time() < deadline:
        reconnecting.cancel()
        await asyncio.wait({reconnecting}, timeout=0.1)
    if reconnecting is not None and not reconnecting.done():
        log.warning("A NATS reconnect attempt outlived close() by %.0fs; leaving it", within_s)


def worker_revision(given: str | None, info: EngineInfo, card_checksum: str | None) -> str:
    """The revision a worker publishes: the one it was given (the operator's, the same on the prefill and
    decode pods of one rollout step), else a hash of what this worker knows fixes its KV layout and its
    model (served name, model card, page size), so that workers started by hand with another page size
    or model never pair. Pure."""
    if given:
        return given
    facts = {"model": info.model_name, "card": card_checksum, "page_size": info.page_size}
    return "w" + hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:12]


class WorkerStartError(DynamoError, RuntimeError):
    """The worker could not start; the message names the step and the fix."""


async def connect_nats(
    url: str,
    *,
    name: str,
    within_s: float = NATS_CONNECT_TIMEOUT_S,
    on_reconnect: Callable[[], None] | None = None,
) -> NATS:
    """Connect to NATS, retrying for ``within_s`` seconds; reconnects forever once connected, and
    calls ``on_reconnect`` after each reconnection (to re-register and re-watch at once: JetStream
    state may be gone when the server restarted without its storage).
    Raises ``WorkerStartError`` naming the URL (without its credentials) and the fix."""
    shown = redact_url(url)
    nc = NATS()
    errors: list[Exception] = []

    async def on_error(e: Exception) -> None:
        if nc.is_connected or nc.is_reconnecting:
            log.warning("NATS error error=%r", e)
        else:
            errors[:] = [e]  # still trying to connect: keep the last reason for the error message

    async def on_disconnect() -> None:
        if not (nc.is_draining or nc.is_closed):
            log.warning("Disconnected from NATS url=%s", shown)

    async def reconnected() -> None:
        log.info("Reconnected to NATS url=%s", shown)
        if on_reconnect is not None:
            on_reconnect()

    try:
        async with asyncio.timeout(within_s):
            await nc.connect(
                url,
                name=name,
                # nats-py annotates these two as int; it passes them to asyncio.wait_for and sleep.
                connect_timeout=min(5.0, within_s),  # type: ignore[arg-type]
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,  # type: ignore[arg-type]
                error_cb=on_error,
                disconnected_cb=on_disconnect,
                reconnected_cb=reconnected,
            )
    except (nats.errors.Error, OSError, TimeoutError) as e:
        with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
            async with asyncio.timeout(2.0):
                await nc.close()
        reason = errors[0] if errors else e
        raise WorkerStartError(
            f"could not connect to NATS at {shown} within {within_s:.0f}s ({reason!r}); start nats-server "
            "with JetStream (-js) or set NATS_SERVER / --nats-server"
        ) from None
    return nc


class _EventRelay:
    """The engine's event sink: KV events to the event plane, load to the event plane and /metrics."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.kv: KvEventPublisher | None = None
        self.load_pub: LoadPublisher | None = None
        self._active = Gauge("dynamo_worker_kv_active_blocks", "KV blocks in use.", registry=registry)
        self._total = Gauge("dynamo_worker_kv_total_blocks", "KV blocks in all.", registry=registry)
        self._waiting = Gauge("dynamo_worker_waiting_requests", "Requests queued.", registry=registry)
        self._running = Gauge("dynamo_worker_running_requests", "Requests running.", registry=registry)
        self._queued_prefill = Gauge(
            "dynamo_worker_waiting_prefill_tokens",
            "Prompt tokens queued for prefill (uncached; a prefill worker's bootstrap queue whole).",
            registry=registry,
        )
        self._handoff = Gauge(
            "dynamo_worker_kv_handoff_requests",
            "Requests in the KV handoff of disaggregated serving: a prefill worker's bootstrap (waiting for "
            "the decode leg's handshake) and transfer queues, a decode worker's prealloc (waiting for KV "
            "memory or the handshake) and transfer queues.",
            ["queue"],
            registry=registry,
        )
        self._kv_events = Counter(
            "dynamo_worker_kv_events",
            "KV cache events (stored, removed, cleared) handed to the event plane for the KV router.",
            registry=registry,
        )

    def kv_events(self, events: Sequence[KvEvent], dp_rank: int = 0) -> None:
        if self.kv is not None:
            self.kv.submit(events, dp_rank)
            self._kv_events.inc(len(events))

    def load(self, snapshot: LoadSnapshot) -> None:
        self._active.set(snapshot.active_blocks)
        self._total.set(snapshot.total_blocks)
        self._waiting.set(snapshot.waiting)
        self._running.set(snapshot.running)
        self._queued_prefill.set(snapshot.waiting_prefill_tokens)
        for queue in ("bootstrap", "prealloc", "transfer"):
            self._handoff.labels(queue).set(getattr(snapshot, f"{queue}_queue"))
        if self.load_pub is not None:
            self.load_pub.update(snapshot)


class Worker:
    """One engine served in this process. ``start`` then ``shutdown``; ``run_worker`` does both."""

    def __init__(self, engine: Engine, settings: RuntimeSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.registry = CollectorRegistry()
        self.system = SystemServer(
            host=settings.listen_host,
            port=settings.system_port,
            registry=self.registry,
            health_check=engine.health_check,
        )
        self.request_server = RequestServer(
            engine.generate,
            host=settings.listen_host,
            port=settings.request_port,
            max_inflight=settings.max_inflight,
            metrics=RequestMetrics(self.registry),
        )
        self.health = HealthMonitor(
            engine.health_check,
            interval_s=settings.health_check_interval_s,
            timeout_s=5.0,
            liveness_fail_after_s=settings.liveness_fail_after_s,
            on_unhealthy=self._deregister,
            on_healthy=self._register,
        )
        self.system.live_check = self.health.live
        self._relay = _EventRelay(self.registry)
        engine.register_metrics(self.registry)
        engine.attach_death(self.engine_died)
        self.watch = ProcessWatch()
        self.lifeline = GroupLifeline()
        self.system.routes.append((LIFELINE_PATH, self.lifeline.handle))
        self.budget = RestartBudget(settings.engine_restart_limit, settings.engine_restart_window_s)
        self._deaths = Counter(
            "dynamo_worker_engine_deaths",
            "Times the engine died under the worker, by what the worker did next (restart or exit).",
            ["action"],
            registry=self.registry,
        )
        self._processes = Gauge(
            "dynamo_worker_engine_process",
            "The engine's processes (1 each, labelled with name and pid): one exiting is the engine's death.",
            ["process", "pid"],
            registry=self.registry,
        )
        self.nc: NATS | None = None
        self.info: EngineInfo | None = None
        self.record: InstanceRecord | None = None
        self.registration: Registration | None = None
        self._stack = contextlib.AsyncExitStack()
        self._card_checksum: str | None = None
        self._renewal: asyncio.Task[None] | None = None
        self._recovery: asyncio.Task[None] | None = None
        self._snapshots: Subscription | None = None
        self.ended = asyncio.Event()  # set when the worker decided to end by itself (engine death)
        self.exit_code = 0

    @property
    def address(self) -> str:
        return f"{self.settings.advertise_host}:{self.request_server.port}"

    async def start(self) -> InstanceRecord:
        s, stack = self.settings, self._stack
        self.nc = await connect_nats(
            s.nats_server, name=f"{s.namespace}.{s.component}.{s.instance_id}", on_reconnect=self._renew_soon
        )
        stack.push_async_callback(self._close_nats)
        if s.system_enabled:
            await self.system.start()
            stack.push_async_callback(self.system.stop)
        self._relay.kv = KvEventPublisher(self.nc, s.namespace, s.instance_id)
        self._relay.load_pub = LoadPublisher(self.nc, s.namespace, s.instance_id)
        self._relay.kv.start()
        stack.push_async_callback(self._relay.kv.stop)
        self._relay.load_pub.start()
        stack.push_async_callback(self._relay.load_pub.stop)
        self._snapshots = await serve_kv_snapshots(self.nc, self._relay.kv)
        stack.push_async_callback(self._stop_snapshots)
        self.engine.attach_events(self._relay)
        stack.push_async_callback(self.request_server.stop)  # after the engine: refusals meanwhile
        stack.push_async_callback(self._stop_engine)  # even if its start fails or is cancelled
        self.info = info = await self.engine.start()
        log.info("Started engine role=%s model=%s", self.engine.role, info.model_name)
        lora = await self._start_loras()
        await self.request_server.start()
        stack.push_async_callback(self._drain)
        if info.model_dir is not None:
            card = await publish_model_card(
                self.nc,
                info.model_dir,
                info.model_name,
                context_length=info.context_length,
                page_size=info.page_size,
                features=info.features,
            )
            self._card_checksum = card.checksum
        else:
            log.warning("Published no model card (the engine has no model folder) model=%s", info.model_name)
        self.record = self._record(info, lora)
        await self._register()
        stack.push_async_callback(self._withdraw)
        self.system.state = "ready"
        self.health.start()
        stack.push_async_callback(self.health.stop)
        self._watch_engine(info)
        stack.push_async_callback(self._stop_watching_engine)  # first: no recovery during shutdown
        log.info(
            "Worker ready instance_id=%s address=%s system_port=%s revision=%s",
            s.instance_id,
            self.address,
            self.system.port,
            self.record.revision,
        )
        return self.record

    def _record(self, info: EngineInfo, lora: LoraState | None) -> InstanceRecord:
        s, checksum = self.settings, self._card_checksum
        return InstanceRecord(
            instance_id=s.instance_id,
            namespace=s.namespace,
            component=s.component,
            endpoint=s.endpoint,
            role=self.engine.role,
            model=info.model_name,
            address=self.address,
            page_size=info.page_size,
            total_kv_blocks=info.total_kv_blocks,
            max_running_requests=info.max_running_requests,
            bootstrap_host=info.bootstrap_host,
            bootstrap_port=info.bootstrap_port,
            dp_size=info.dp_size,
            model_card_checksum=checksum,
            revision=worker_revision(s.pair_revision, info, checksum),
            started_at=time.time(),
            lora=lora,
            takes_stream_interval=True,
        )

    async def _start_loras(self) -> LoraState | None:
        """The LoRA adapters the engine holds, and ``/v1/loras`` on the system port (None: no LoRA)."""
        limits = self.engine.lora_limits()
        if limits is None:
            self.system.loras.enabled = False
            return None
        manager = LoraManager(
            self.engine, limits, timeout_s=self.settings.lora_load_timeout_s, on_change=self._loras_changed
        )
        await manager.adopt(self.engine.startup_loras())
        self.system.loras.manager = manager
        self.system.loras.enabled = True
        return manager.state()

    async def _loras_changed(self, state: LoraState) -> None:
        """Publish a change of adapters now (the frontend routes on it), not at the next heartbeat."""
        if self.record is None:
            return
        self.record = self.record.model_copy(update={"lora": state})
        if self.registration is not None:
            try:
                await self.registration.update(self.record)
            except (nats.errors.Error, TimeoutError) as e:  # the heartbeat writes it within TTL/3
                log.warning("Could not publish a change of LoRA adapters now error=%r", e)

    # --- engine death ----------------------------------------------------------------------------

    def _watch_engine(self, info: EngineInfo) -> None:
        processes = list(self.engine.processes())
        self._processes.clear()
        for p in processes:
            self._processes.labels(process=p.name, pid=str(p.pid)).set(1)
        if processes:
            log.info("Watching the engine's processes %s", " ".join(f"{p.name}={p.pid}" for p in processes))
        self.watch.watch(processes, self._process_exited)
        self.lifeline.arm(info.nnodes, self.engine_died)

    def _process_exited(self, process: EngineProcess, how: str) -> None:
        self.engine_died(f"engine process {process.name} (pid {process.pid}) ended: {how}")

    def engine_died(self, reason: str) -> None:
        """The engine is dead: hand back the in-flight requests, then restart it or exit (once)."""
        if self.system.state != "ready" or (self._recovery is not None and not self._recovery.done()):
            log.warning("Engine failure while %s (not acted on again): %s", self.system.state, reason)
            return
        self._recovery = asyncio.create_task(self._recover(reason), name="engine-recovery")

    async def _recover(self, reason: str) -> None:
        died = time.monotonic()
        log.error("Engine died: %s", reason)
        self.watch.close()
        self.lifeline.disarm()
        self.system.state, self.system.state_reason = "restarting", f"the engine died: {reason}"
        message = (
            f"the engine of worker {self.settings.instance_id} died ({reason}); continue the request on "
            "another worker"
        )
        self.request_server.refuse("engine_died", message)
        handed_back = self.request_server.abort_all("engine_died", message)
        await self.health.stop()
        await self._deregister(reason)
        self._kv_cleared()
        log.warning(
            "Handed back in-flight requests count=%s and deregistered after_s=%.3f",
            handed_back,
            time.monotonic() - died,
        )
        nnodes = self.info.nnodes if self.info is not None else 1
        decision = decide(
            self.settings.on_engine_death, nnodes=nnodes, deaths=self.budget.record(died), budget=self.budget
        )
        self._deaths.labels(action=decision.action).inc()
        if decision.action == "exit":
            log.error("Engine died; %s", decision.why)
            self._end(EXIT_ENGINE_DIED)
            return
        log.warning("Engine died; %s", decision.why)
        self.system.state_reason = f"the engine died ({reason}); {decision.why}"
        await self.request_server.wait_idle(5.0)
        try:
            async with asyncio.timeout(max(self.settings.graceful_shutdown_s, 10.0)):
                await self.engine.stop()
            info = await self.engine.start()
            lora = await self._start_loras()
        except Exception as e:  # any failure to come back ends the process, which Kubernetes restarts
            log.error("Could not restart the engine: %s; exiting so that Kubernetes restarts it", e)
            self._end(EXIT_ENGINE_DIED)
            return
        self.info, self.record = info, self._record(info, lora)
        self.request_server.resume()
        owed = False
        try:
            await self._register()
        except (DiscoveryError, nats.errors.Error, OSError, TimeoutError) as e:
            log.warning("Could not register again after the restart; the health monitor retries error=%r", e)
            owed = True
        self.system.state, self.system.state_reason = "ready", None
        self.health.start(registration_owed=owed)
        self._watch_engine(info)
        log.warning("Engine restarted; the worker serves again after_s=%.1f", time.monotonic() - died)

    def _kv_cleared(self) -> None:
        """The engine's KV cache is gone: the routers' view of it must go too."""
        ranks = self.info.dp_size if self.info is not None else 1
        for rank in range(ranks):
            self._relay.kv_events([AllBlocksCleared()], rank)

    def _end(self, code: int) -> None:
        self.exit_code = code
        self.ended.set()

    def _renew_soon(self) -> None:
        """After a NATS reconnect, write the registration now instead of at the next heartbeat."""
        if self.registration is not None:
            self._renewal = asyncio.create_task(self.registration.renew(), name="renew-registration")

    async def _register(self) -> None:
        assert self.nc is not None and self.record is not None
        self.registration = await register(self.nc, self.record, self.settings.discovery_ttl)

    async def _deregister(self, reason: str) -> None:
        if self.registration is not None:
            registration, self.registration = self.registration, None
            await registration.deregister()

    async def shutdown(self) -> None:
        """Deregister, drain within the grace period, stop everything. Safe after a partial start."""
        self.system.state = "draining"
        self.system.loras.draining = True
        await self._stack.aclose()
        log.info("Worker stopped instance_id=%s", self.settings.instance_id)

    async def _stop_watching_engine(self) -> None:
        self.watch.close()
        self.lifeline.disarm()
        if self._recovery is not None:
            await cancel_and_wait(self._recovery)

    async def _withdraw(self) -> None:
        """Out of discovery first, so no new traffic is routed here: no renewal, no record."""
        registration, self.registration = self.registration, None
        if self._renewal is not None:
            await cancel_and_wait(self._renewal)
        if registration is not None:
            await registration.deregister()

    async def _drain(self) -> None:
        aborted = await self.request_server.drain(self.settings.graceful_shutdown_s)
        log.info("Drained requests aborted=%s", aborted)

    async def _stop_engine(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(self.settings.graceful_shutdown_s, 10.0)):
                await self.engine.stop()

    async def _stop_snapshots(self) -> None:
        if self._snapshots is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._snapshots.unsubscribe()
            self._snapshots = None

    async def _close_nats(self) -> None:
        if self.nc is not None:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                async with asyncio.timeout(5.0):
                    await self.nc.drain()
            await close_nats(self.nc)
            self.nc = None


async def run_worker(engine: Engine, settings: RuntimeSettings, *, stop: asyncio.Event | None = None) -> int:
    """Serve ``engine`` until SIGTERM/SIGINT (or ``stop`` is set), then shut down gracefully.
    Returns the process exit code: 0 after a clean shutdown, 1 when starting failed, ``EXIT_ENGINE_DIED``
    when the engine died and the worker did not restart it."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    worker = Worker(engine, settings)
    try:
        starting = asyncio.create_task(worker.start(), name="worker-start")
        stopping = asyncio.create_task(stop.wait(), name="worker-stop-signal")
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # stopped while starting (e.g. SIGTERM during a long model load)
            log.info("Stopped while starting instance_id=%s", settings.instance_id)
            with contextlib.suppress(Exception):
                await cancel_and_wait(starting)
            await worker.shutdown()
            return 0
        try:
            starting.result()
        except Exception as e:  # any start failure ends the process with its reason; mapped to exit 1
            stopping.cancel()
            expected = isinstance(e, (WorkerStartError, DiscoveryError, ModelCardError, OSError))
            log.error("Worker failed to start: %s", e, exc_info=not expected)
            await worker.shutdown()
            return 1
        ended = asyncio.create_task(worker.ended.wait(), name="worker-ended")
        await asyncio.wait({stopping, ended}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stopping, ended):
            task.cancel()
        log.info(
            "Shutting down instance_id=%s grace_s=%s", settings.instance_id, settings.graceful_shutdown_s
        )
        await worker.shutdown()
        if worker.exit_code:
            log.error("Worker exits with status %s (its engine died)", worker.exit_code)
        return worker.exit_code
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
