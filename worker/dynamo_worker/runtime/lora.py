"""LoRA adapters of a worker: ``/v1/loras`` on its system port (NVIDIA Dynamo's shape), for any engine.

::

    POST   /v1/loras   {"lora_name": str, "source": {"uri": str}, "pinned": bool = false}
           -> 200 {"status": "success", "message", "lora_name", "evicted": [names]}
    GET    /v1/loras   -> 200 {"status": "success", "loras": [{"lora_name", "uri", "rank", "pinned"}],
                               "count", "max_loaded_loras", "max_loras_per_batch", "max_lora_rank",
                               "cannot_load"}
    DELETE /v1/loras/{lora_name} -> 200 {"status": "success", "message", "lora_name"}

Errors are ``{"status": "error", "reason", "message"}`` with the reasons of ``runtime.lora_checks``.

An engine that runs with LoRA but can load no adapter (``LoraLimits.cannot_load``: SGLang under
``--load-format dummy``) refuses every load with ``LoraNotSupported`` and publishes why in discovery.

A load checks everything it can before the engine sees the adapter (``lora_checks``: the source, the
PEFT folder, rank and target modules against the engine's limits, the slots), so a refusal names the
flag or the file to fix; then the engine loads it (``LoraEngine``). Loading a name again from the same
source is a success that does nothing; from another source it is ``NameConflict`` (unload it first:
the router keys an adapter's cached prefixes on its name, and a new adapter under an old name must not
inherit them). With ``--max-loaded-loras`` reached, the engine evicts its least recently used unpinned
adapter, as SGLang does (the answer names it in ``evicted``); ``NoFreeSlot`` when all are pinned. An
unload takes the adapter out of discovery first, so no new request is routed to it, then waits for the
engine (which lets the adapter's running requests finish).

One load or unload runs at a time, each bounded by ``--lora-load-timeout-s``. After every change the
worker rewrites its discovery record at once (``on_change``), not at its next heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dynamo_worker.protocol import LORA_NAME_MAX, LoraAdapter, LoraState
from dynamo_worker.runtime.lora_checks import (
    AdapterConfig,
    LoraError,
    LoraLimits,
    Source,
    StartupAdapter,
    check_fits,
    effective_limits,
    parse_source,
    read_adapter_config,
    same_source,
    source_of_path,
)

__all__ = ["LORAS_PATH", "LoraApi", "LoraEngine", "LoraManager", "fetch_source"]

log = logging.getLogger(__name__)

LORAS_PATH = "/v1/loras"
HF_PATTERNS = ["*.json", "*.safetensors", "*.bin"]


class LoraEngine(Protocol):
    """What an engine does for ``LoraManager``: load and unload by name. Each returns the names the
    engine holds afterwards (an engine at its ``--max-loaded-loras`` may have evicted one), and raises
    ``LoraError`` for a refusal of its own."""

    async def load_lora(self, name: str, path: str, pinned: bool) -> Sequence[str]: ...

    async def unload_lora(self, name: str) -> Sequence[str]: ...


class _SourceBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    uri: str = Field(min_length=1)


class _LoadBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    lora_name: str = Field(min_length=1, max_length=LORA_NAME_MAX, pattern=r"^[^\s]+$")
    source: _SourceBody
    pinned: bool = False


def _parse_body(body: Any) -> _LoadBody:
    try:
        return _LoadBody.model_validate(body)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'body'}: {x['msg']}" for x in e.errors())
        raise LoraError(
            "InvalidRequest",
            f"the body must be {{'lora_name': NAME, 'source': {{'uri': URI}}, 'pinned': false}} ({problems})",
        ) from None


def _hf_fetch(source: Source) -> Path:
    """Download (or find in the hub cache) an ``hf://`` adapter; ``LoraError`` saying what is missing."""
    try:
        import huggingface_hub
        from huggingface_hub import errors
    except ImportError:
        raise LoraError(
            "SourceUnreachable",
            f"{source.uri}: huggingface_hub is not installed on this worker; pip install huggingface_hub, "
            "or copy the adapter to a volume and load it with file://",
        ) from None
    try:
        folder = huggingface_hub.snapshot_download(
            source.location, revision=source.revision, allow_patterns=HF_PATTERNS
        )
    except errors.RevisionNotFoundError:
        raise LoraError(
            "InvalidSource", f"{source.uri}: the repository has no revision {source.revision!r}"
        ) from None
    except (errors.RepositoryNotFoundError, errors.GatedRepoError) as e:
        raise LoraError(
            "SourceUnreachable",
            f"{source.uri}: the Hugging Face Hub denies access or has no such repository "
            f"({type(e).__name__}); set HF_TOKEN on the worker pods for a private or gated repository, or "
            "check the name",
        ) from None
    except Exception as e:  # no network, offline mode without a cached copy, hub errors: all unreachable
        raise LoraError(
            "SourceUnreachable",
            f"{source.uri} could not be fetched from the Hugging Face Hub ({type(e).__name__}: {e}); give "
            "the worker pods network access to huggingface.co (and HF_TOKEN for a private repository), "
            "or put the adapter in their hub cache (HF_HUB_OFFLINE=1 then uses it), or copy it to a "
            "volume and load it with file://",
        ) from None
    return Path(folder)


async def fetch_source(source: Source) -> Path:
    """The local folder of an adapter source (an ``hf://`` one is downloaded first)."""
    if source.scheme == "file":
        return Path(source.location)
    return await asyncio.to_thread(_hf_fetch, source)


@dataclass
class _Held:
    adapter: LoraAdapter
    config: AdapterConfig | None


class LoraManager:
    """The adapters one engine holds, and the loads and unloads of ``/v1/loras``."""

    def __init__(
        self,
        engine: LoraEngine,
        limits: LoraLimits,
        *,
        timeout_s: float,
        on_change: Callable[[LoraState], Awaitable[None]] | None = None,
        fetch: Callable[[Source], Awaitable[Path]] = fetch_source,
    ) -> None:
        self.engine = engine
        self.flags = limits
        self.limits = limits
        self.timeout_s = timeout_s
        self.on_change = on_change
        self._fetch = fetch
        self._held: dict[str, _Held] = {}
        self._lock = asyncio.Lock()

    # --- state -------------------------------------------------------------------------------------

    def state(self) -> LoraState:
        return LoraState(
            adapters=[h.adapter for h in self._held.values()],
            max_loras_per_batch=self.limits.max_loras_per_batch,
            max_loaded_loras=self.limits.max_loaded_loras,
            max_lora_rank=self.limits.max_lora_rank,
            cannot_load=self.limits.cannot_load,
        )

    def listing(self) -> dict[str, Any]:
        loras = [
            {"lora_name": a.name, "uri": a.uri, "rank": a.rank, "pinned": a.pinned}
            for a in (h.adapter for h in self._held.values())
        ]
        return {
            "status": "success",
            "loras": loras,
            "count": len(loras),
            "max_loaded_loras": self.limits.max_loaded_loras,
            "max_loras_per_batch": self.limits.max_loras_per_batch,
            "max_lora_rank": self.limits.max_lora_rank,
            "cannot_load": self.limits.cannot_load,
        }

    async def adopt(self, startup: Sequence[StartupAdapter]) -> None:
        """Take over the adapters the engine loaded at start (``--lora-paths``): read their configs
        (where they are local folders) and infer the limits SGLang infers from them."""
        configs = []
        for item in startup:
            uri = source_of_path(item.path)
            config = None
            if uri.startswith("file://"):
                try:
                    config = await asyncio.to_thread(read_adapter_config, Path(item.path))
                    configs.append(config)
                except LoraError as e:
                    log.warning("Could not read a startup adapter's config name=%s: %s", item.name, e.message)
            adapter = LoraAdapter(
                name=item.name, uri=uri, rank=config.rank if config else None, pinned=item.pinned
            )
            self._held[item.name] = _Held(adapter, config)
        self.limits = effective_limits(self.flags, configs)
        if startup:
            log.info(
                "Serving LoRA adapters from --lora-paths names=%s max_lora_rank=%s",
                ",".join(a.name for a in startup),
                self.limits.max_lora_rank,
            )

    # --- changes ---------------------------------------------------------------------------------

    async def load(self, body: Any) -> dict[str, Any]:
        if self.limits.cannot_load is not None:
            raise LoraError(
                "LoraNotSupported", f"this worker cannot load adapters: {self.limits.cannot_load}"
            )
        req = _parse_body(body)
        name = req.lora_name
        source = parse_source(req.source.uri)
        async with self._lock:
            held = self._held.get(name)
            if held is not None:
                if same_source(held.adapter.uri, source.uri):
                    return _ok(name, f"adapter {name!r} is loaded already from {held.adapter.uri}")
                raise LoraError(
                    "NameConflict",
                    f"adapter {name!r} is loaded from {held.adapter.uri}, not {source.uri}; unload it first "
                    f"(DELETE {LORAS_PATH}/{name}) or load this one under another name",
                )
            deadline = asyncio.get_running_loop().time() + self.timeout_s
            try:
                async with asyncio.timeout_at(deadline):
                    config, path = await self._checked(name, source, req.pinned)
                # not cancelled at the bound: an engine stopped half-way through a load is worse
                work = asyncio.ensure_future(self.engine.load_lora(name, str(path), req.pinned))
                async with asyncio.timeout_at(deadline):
                    after = await asyncio.shield(work)
            except TimeoutError:
                raise LoraError(
                    "LoadFailed",
                    f"loading adapter {name!r} did not finish within {self.timeout_s:.0f}s "
                    "(--lora-load-timeout-s); it is not listed (retry the same load later), check the "
                    "worker's log, or raise the bound for large adapters",
                ) from None
            adapter = LoraAdapter(name=name, uri=source.uri, rank=config.rank, pinned=req.pinned)
            evicted = [n for n in self._held if n not in after]
            for n in evicted:
                log.info(
                    "Evicted LoRA adapter name=%s (--max-loaded-loras %s)", n, self.limits.max_loaded_loras
                )
                del self._held[n]
            self._held[name] = _Held(adapter, config)
            log.info(
                "Loaded LoRA adapter name=%s uri=%s rank=%s pinned=%s",
                name,
                source.uri,
                config.rank,
                req.pinned,
            )
            await self._changed()
        message = f"loaded adapter {name!r} from {source.uri}"
        if evicted:
            message += f"; evicted {', '.join(evicted)} (--max-loaded-loras {self.limits.max_loaded_loras})"
        return {**_ok(name, message), "evicted": evicted}

    async def _checked(self, name: str, source: Source, pinned: bool) -> tuple[AdapterConfig, Path]:
        """The adapter's config and folder, once everything the engine would refuse is ruled out."""
        path = await self._fetch(source)
        config = await asyncio.to_thread(read_adapter_config, path)
        check_fits(name, config, self.limits)
        adapters = [h.adapter for h in self._held.values()]
        pinned_now = sum(a.pinned for a in adapters)
        if pinned and pinned_now >= self.limits.max_loras_per_batch - 1:
            raise LoraError(
                "NoFreeSlot",
                f"cannot pin adapter {name!r}: {pinned_now} of the {self.limits.max_loras_per_batch} batch "
                "slots (--max-loras-per-batch) are pinned, and one must stay for unpinned adapters and the "
                "base model; load it unpinned, unpin one, or raise --max-loras-per-batch",
            )
        cap = self.limits.max_loaded_loras
        if cap is not None and len(adapters) >= cap and all(a.pinned for a in adapters):
            raise LoraError(
                "NoFreeSlot",
                f"this worker holds {len(adapters)} adapters, its --max-loaded-loras, and all are pinned, so "
                f"none can make room for {name!r}; unload one (DELETE {LORAS_PATH}/NAME) or raise "
                "--max-loaded-loras",
            )
        return config, path

    async def unload(self, name: str) -> dict[str, Any]:
        async with self._lock:
            held = self._held.pop(name, None)
            if held is None:
                names = ", ".join(self._held) or "none"
                raise LoraError("NotFound", f"this worker holds no adapter {name!r} (it holds: {names})")
            await self._changed()  # out of discovery before the engine waits for its running requests
            work = asyncio.ensure_future(self.engine.unload_lora(name))
            try:
                after = await asyncio.wait_for(asyncio.shield(work), self.timeout_s)
            except TimeoutError:
                raise LoraError(
                    "LoadFailed",
                    f"unloading adapter {name!r} did not finish within {self.timeout_s:.0f}s "
                    "(--lora-load-timeout-s): its running requests go on; it gets no new ones",
                ) from None
            except LoraError:
                self._held[name] = held  # the engine still holds it
                await self._changed()
                raise
            for n in [n for n in self._held if n not in after]:
                del self._held[n]
            log.info("Unloaded LoRA adapter name=%s", name)
        return _ok(name, f"unloaded adapter {name!r}")

    async def _changed(self) -> None:
        if self.on_change is not None:
            await self.on_change(self.state())


def _ok(name: str, message: str) -> dict[str, Any]:
    return {"status": "success", "message": message, "lora_name": name}


class LoraApi:
    """The ``/v1/loras`` routes of the system server. ``manager`` is set once the engine runs with LoRA
    (``enabled`` True), or ``enabled`` is set False; until then every call is ``NotReady``."""

    def __init__(self) -> None:
        self.manager: LoraManager | None = None
        self.enabled: bool | None = None
        self.draining = False
        self.leader_only: int | None = None  # a multinode rank > 0: its leader serves /v1/loras

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(LORAS_PATH, self._list)
        app.router.add_post(LORAS_PATH, self._load)
        app.router.add_delete(LORAS_PATH + "/{lora_name:.+}", self._unload)

    def _ready(self) -> LoraManager:
        if self.leader_only:
            raise LoraError(
                "NotReady",
                f"this is rank {self.leader_only} of a multinode engine: its leader (rank 0) loads adapters "
                "on every rank of the group; call the leader's system port",
            )
        if self.draining:
            raise LoraError("NotReady", "the worker is shutting down; load adapters on its successor")
        if self.enabled is None:
            raise LoraError("NotReady", "the engine is still starting; retry once /health answers 200")
        if self.manager is None:
            raise LoraError(
                "LoraNotEnabled",
                "this worker runs without LoRA; start it with --enable-lora (and --max-lora-rank and "
                "--lora-target-modules, or --lora-paths) to load adapters",
            )
        return self.manager

    async def _answer(self, op: Callable[[LoraManager], Awaitable[dict[str, Any]]]) -> web.Response:
        try:
            return web.json_response(await op(self._ready()))
        except LoraError as e:
            if e.status >= 500:
                log.warning("LoRA request failed reason=%s: %s", e.reason, e.message)
            return web.json_response(e.body(), status=e.status)

    async def _list(self, _: web.Request) -> web.Response:
        async def listing(m: LoraManager) -> dict[str, Any]:
            return m.listing()

        return await self._answer(listing)

    async def _load(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        return await self._answer(lambda m: m.load(body))

    async def _unload(self, request: web.Request) -> web.Response:
        return await self._answer(lambda m: m.unload(request.match_info["lora_name"]))
