"""dynamo-run's DynamoModels: each LoRA adapter declared beside the graph, loaded on every worker serving
its base model, as the operator loads it in a cluster.

Once every process is ready, each ``lora``/``adapter`` DynamoModel of the manifest file is put on each
prefill, decode and aggregated worker whose base model is its ``baseModelName`` (``adapter_services``)
through the worker's system port (``dynamo_clients.lora_client.ensure``, the operator's own call). Then
dynamo-run waits (bounded) until the frontend lists it in ``/v1/models``, so that a request sent after
the Ready lines finds it. ``base`` models load nothing.

``file://`` sources: an absolute ``file:///path`` is used as written; a relative one
(``file://adapters/x`` or ``file://./adapters/x``) is resolved against the manifest's folder, or against
``--adapter-dir`` when given. A failure (no worker serves the base model, a worker refused the adapter,
the frontend never lists it) is reported loudly with the worker's reason and message; the graph keeps
serving the base model and the adapters that loaded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from dynamo_api import contract
from dynamo_api.dynamo_model import DynamoModel, is_relative_file
from dynamo_api.loras import adapter_services
from dynamo_api.models import DynamoGraphDeployment
from dynamo_clients import lora_client

from dynamo_worker.local.kubelet import LOOPBACK
from dynamo_worker.local.plan import Plan, ProcessSpec

__all__ = ["Adapter", "Loaded", "adapters_of", "load_adapters", "ready_lines", "resolve_uri", "targets"]

log = logging.getLogger(__name__)

LISTED_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Adapter:
    """A DynamoModel as dynamo-run loads it."""

    resource: str  # metadata.name
    name: str  # spec.modelName: what requests ask for
    base: str  # spec.baseModelName
    uri: str  # spec.source.uri, a relative file:// resolved


@dataclass
class Loaded:
    """What became of one adapter: the workers holding it, and each failure (worker: reason: message)."""

    adapter: Adapter
    workers: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    listed: bool = False


def resolve_uri(uri: str, folder: Path) -> str:
    """``uri`` with a relative ``file://`` path made absolute against ``folder``; others unchanged."""
    if not is_relative_file(uri):
        return uri
    return f"file://{(folder / uri.removeprefix('file://')).resolve()}"


def adapters_of(models: Sequence[DynamoModel], folder: Path) -> list[Adapter]:
    """The adapters to load (``base`` models load nothing), their sources resolved against ``folder``."""
    return [
        Adapter(m.name, m.spec.model_name, m.spec.base_model_name, resolve_uri(m.spec.source.uri, folder))
        for m in models
        if m.spec.loads_adapter and m.spec.source is not None
    ]


def targets(plan: Plan, dgd: DynamoGraphDeployment, base: str) -> list[ProcessSpec]:
    """The serving worker processes (a multinode group's leader) of the services serving ``base``."""
    services = {c.name for c in adapter_services(dgd, base)}
    return [
        p
        for p in plan.processes
        if p.kind == "worker" and p.health_url and p.service in services and contract.SYSTEM_PORT in p.ports
    ]


def _address(p: ProcessSpec) -> str:
    return f"http://{LOOPBACK}:{p.ports[contract.SYSTEM_PORT]}"


async def _load_one(
    session: aiohttp.ClientSession, adapter: Adapter, workers: Sequence[ProcessSpec]
) -> Loaded:
    loaded = Loaded(adapter)
    if not workers:
        loaded.failures.append(
            f"no worker serves its base model {adapter.base}: give spec.baseModelName the graph's "
            "--served-model-name (or a worker's modelRef.name)"
        )
        return loaded
    for worker, outcome in zip(
        workers,
        await asyncio.gather(
            *(lora_client.ensure(session, _address(w), adapter.name, adapter.uri) for w in workers),
            return_exceptions=True,
        ),
        strict=True,
    ):
        if isinstance(outcome, lora_client.EnsureOutcome) and outcome.held:
            loaded.workers.append(worker.name)
        elif isinstance(outcome, lora_client.EnsureOutcome) and outcome.refusal is not None:
            loaded.failures.append(f"{worker.name}: {outcome.refusal.reason}: {outcome.refusal.message}")
        elif isinstance(outcome, BaseException):
            loaded.failures.append(f"{worker.name}: {outcome}")
    return loaded


async def _listed(session: aiohttp.ClientSession, url: str, names: set[str], timeout_s: float) -> set[str]:
    """The ``names`` the frontend at ``url`` lists in /v1/models, waiting up to ``timeout_s`` for all."""
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    while True:
        try:
            async with session.get(f"{url}/v1/models", timeout=aiohttp.ClientTimeout(total=5)) as r:
                seen = {m.get("id") for m in (await r.json()).get("data", [])} & names
        except (aiohttp.ClientError, TimeoutError, ValueError):
            pass
        if seen == names or time.monotonic() > deadline:
            return seen
        await asyncio.sleep(0.2)


async def _load_all(plan: Plan, dgd: DynamoGraphDeployment, adapters: Sequence[Adapter]) -> list[Loaded]:
    async with aiohttp.ClientSession() as session:
        results = list(
            await asyncio.gather(*(_load_one(session, a, targets(plan, dgd, a.base)) for a in adapters))
        )
        names = {r.adapter.name for r in results if r.workers}
        listed = await _listed(session, plan.url, names, LISTED_TIMEOUT_S) if names else set()
    for r in results:
        r.listed = r.adapter.name in listed
    return results


def load_adapters(plan: Plan, dgd: DynamoGraphDeployment, adapters: Sequence[Adapter]) -> list[Loaded]:
    """Load ``adapters`` on their workers; log each failure loudly. What became of each."""
    results = asyncio.run(_load_all(plan, dgd, adapters)) if adapters else []
    for r in results:
        for failure in r.failures:
            log.error(
                "DynamoModel %s (adapter %s) was not loaded on %s",
                r.adapter.resource,
                r.adapter.name,
                failure,
            )
        if r.workers and not r.listed:
            log.error(
                "DynamoModel %s: adapter %s is loaded on %s, but the frontend does not list it in /v1/models "
                "after %.0fs; requests for it may get 404 (the frontend's log says why)",
                r.adapter.resource,
                r.adapter.name,
                ", ".join(r.workers),
                LISTED_TIMEOUT_S,
            )
    return results


def ready_lines(results: Sequence[Loaded]) -> list[str]:
    """The adapters' part of dynamo-run's Ready lines."""
    lines = []
    for r in results:
        where = ", ".join(r.workers) or "no worker"
        failed = f"; FAILED on {len(r.failures)} (see the errors above)" if r.failures else ""
        lines.append(f"  adapter: {r.adapter.name} (base {r.adapter.base}) on {where}{failed}")
    return lines
