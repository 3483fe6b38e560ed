"""Which models are served, by which workers: discovery events in, a lookup for each request out.

A model is *served* while its registered workers can complete a request (an aggregated worker, or a
prefill and a decode worker of one revision, ``models.pairing``) and its tokenizer is loaded (from
the worker's model card). The first worker of a model triggers one card fetch. A worker that registers
with a different model card (an updated tokenizer) makes the frontend load that card; requests use the
previous one until it is loaded.

More: docs/module-notes.md (dynamo_worker.frontend.models.registry)."""

from __future__ import annotations

import asyncio
import logging
import time
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from dynamo_worker.frontend.errors import AdapterNotFound, InvalidRequest, ModelNotFound, ServiceUnavailable
from dynamo_worker.frontend.models.lora_adapters import (
    AdapterName,
    held_adapters,
    holders,
    resolve_adapter,
    unserved_reason,
)
from dynamo_worker.frontend.models.pairing import Pair, newest_pair, unpaired
from dynamo_worker.frontend.models.preprocessor import Preprocessor
from dynamo_worker.protocol import LANGUAGE_ROLES, InstanceRecord, LoraAdapter, Role
from dynamo_worker.router import Router
from dynamo_worker.runtime.aio import cancel_and_wait
from dynamo_worker.runtime.discovery import InstanceAdded, InstanceEvent, InstanceRemoved

log = logging.getLogger(__name__)

__all__ = ["CardLoader", "ModelEntry", "ModelRegistry"]


# --- the served models ----------------------------------------------------------------------------

CARD_LOAD_ATTEMPTS = 3

CardLoader = Callable[[InstanceRecord], Awaitable[Preprocessor]]
# (model, role) -> workers, and (model, revision, role) -> workers of a revision without the other role
WorkerCounts = dict[tuple[str, str], int]
UnpairedCounts = dict[tuple[str, str, str], int]


@dataclass
class ModelEntry:
    name: str
    workers: dict[str, InstanceRecord] = field(default_factory=dict)
    preprocessor: Preprocessor | None = None
    card_checksum: str | None = None  # of the model card the preprocessor was loaded from
    load_error: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))  # first seen (/v1/models "created")
    served_once: bool = False  # it could serve a request at some point (workers and a loaded card)
    left_at: float | None = None  # when its last worker left (monotonic), for the retention
    # A base model: the LoRA adapters its workers hold (kept when its last worker leaves). An adapter's
    # view (``ModelRegistry.resolve``): the adapter it serves, and its base model.
    adapters: dict[str, LoraAdapter] = field(default_factory=dict)
    lora_name: str | None = None
    base: str | None = None
    # Derived from ``workers``, computed once per change of them (``workers_changed``), not per request.
    _pair: Pair | None = field(default=None, repr=False)
    _pair_known: bool = field(default=False, repr=False)
    _can_serve: bool | None = field(default=None, repr=False)
    _by_role: dict[Role, list[InstanceRecord]] = field(default_factory=dict, repr=False)

    def by_role(self, role: Role) -> list[InstanceRecord]:
        """Its workers of ``role`` (shared until the workers change: do not modify)."""
        found = self._by_role.get(role)
        if found is None:
            found = self._by_role[role] = [w for w in self.workers.values() if w.role == role]
        return found

    def pair(self) -> Pair | None:
        """The prefill and decode workers disaggregated requests go to (``models.pairing``)."""
        if not self._pair_known:
            self._pair = newest_pair(self.by_role("prefill"), self.by_role("decode"))
            self._pair_known = True
        return self._pair

    def workers_changed(self) -> None:
        self._pair_known = False
        self._can_serve = None
        self._by_role.clear()

    def can_serve(self) -> bool:
        """Its workers can complete a request: an aggregated worker, or a prefill and a decode worker of
        one revision (``models.pairing``; ``dispatch`` answers 503 for any other mix)."""
        if self._can_serve is None:
            roles = {w.role for w in self.workers.values()}
            self._can_serve = "agg" in roles or "diffusion" in roles or self.pair() is not None
        return self._can_serve

    def ready(self) -> bool:
        """It can serve a request now: its workers can, and its tokenizer is loaded (images need none)."""
        return self.can_serve() and (self.preprocessor is not None or self.generates_images())

    def generates_images(self) -> bool:
        """Served by diffusion workers only (``/v1/images/generations``; no tokenizer, no chat)."""
        return bool(self.workers) and all(w.role == "diffusion" for w in self.workers.values())


class ModelRegistry:
    def __init__(
        self,
        router: Router,
        load_card: CardLoader,
        namespace: str,
        load_timeout_s: float,
        on_change: Callable[[WorkerCounts, UnpairedCounts], None] | None = None,
        *,
        retention_s: float = 0.0,
        graph_models: Sequence[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_change = on_change
        self.retention_s = retention_s
        self.graph_models = tuple(dict.fromkeys(graph_models))
        self._clock = clock
        self._started = int(time.time())
        self._listeners: list[Callable[[], None]] = []
        self._unpaired_said: set[tuple[str, str, str]] = set()
        self._router = router
        self._load_card = load_card
        self.namespace = namespace
        self._load_timeout_s = load_timeout_s
        self._models: dict[str, ModelEntry] = {}
        self._views: dict[AdapterName, ModelEntry] = {}  # adapter views, rebuilt after every change
        self._loads: dict[str, asyncio.Task[None]] = {}
        self._changed = asyncio.Event()

    # --- feeding ------------------------------------------------------------------------------

    def apply(self, event: InstanceEvent) -> None:
        if isinstance(event, InstanceAdded):
            self._add(event.record)
        elif isinstance(event, InstanceRemoved):
            self._remove(event.instance_id)
        unpaired_now = self._report_unpaired()
        if self._on_change is not None:
            counts = {
                (e.name, role): len(e.by_role(role))
                for e in self._models.values()
                for role in typing.get_args(Role)
            }
            self._on_change(counts, unpaired_now)
        self._changed_now()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every change of workers or model cards (``serving.admission``)."""
        self._listeners.append(listener)

    def _changed_now(self) -> None:
        self._views.clear()
        for entry in self._models.values():
            if not entry.served_once and entry.ready():
                entry.served_once = True
        self._changed.set()
        for listener in self._listeners:
            listener()

    def _report_unpaired(self) -> UnpairedCounts:
        """Say once (per revision and role, until it pairs or leaves) that a revision of a model has
        prefill or decode workers only: they get no disaggregated traffic."""
        now: UnpairedCounts = {}
        for entry in self._models.values():
            for (rev, role), n in unpaired(entry.by_role("prefill"), entry.by_role("decode")).items():
                now[(entry.name, rev or "none", role)] = n
        for model, rev, role in sorted(now.keys() - self._unpaired_said):
            other = "decode" if role == "prefill" else "prefill"
            log.warning(
                "Revision has %s workers but no %s worker model=%s revision=%s workers=%d: they get no "
                "traffic until a %s worker of the same revision registers (a rollout in progress, or prefill "
                "and decode workers that differ in what fixes the KV layout: model, --page-size, image)",
                role,
                other,
                model,
                rev,
                now[(model, rev, role)],
                other,
            )
        self._unpaired_said = set(now)
        return now

    def _add(self, record: InstanceRecord) -> None:
        for entry in self._models.values():  # a changed record may have changed model
            if record.instance_id in entry.workers and entry.name != record.model:
                del entry.workers[record.instance_id]
                entry.workers_changed()
        entry = self._models.setdefault(record.model, ModelEntry(record.model))
        entry.workers[record.instance_id] = record
        entry.workers_changed()
        entry.adapters = held_adapters(entry.workers.values())
        entry.left_at = None
        if record.role not in LANGUAGE_ROLES:
            return  # encode and diffusion workers hold no KV cache and publish no model card
        self._router.add_worker(record)
        new_card = (
            record.model_card_checksum is not None and record.model_card_checksum != entry.card_checksum
        )
        if (entry.preprocessor is None or new_card) and record.model not in self._loads:
            self._loads[record.model] = asyncio.create_task(
                self._load(entry, record), name=f"load-{record.model}"
            )

    def _remove(self, instance_id: str) -> None:
        for entry in self._models.values():
            if entry.workers.pop(instance_id, None) is None:
                continue
            entry.workers_changed()
            if entry.workers:  # without workers it keeps the adapters its last ones held
                entry.adapters = held_adapters(entry.workers.values())
            else:
                entry.left_at = self._clock()
                kept = self.keeps(entry.name)
                log.info(
                    "Model has no workers left model=%s%s",
                    entry.name,
                    " (listed and its requests held until a worker registers)" if kept else "",
                )
        self._router.remove_worker(instance_id)

    async def _load(self, entry: ModelEntry, record: InstanceRecord) -> None:
        try:
            entry.preprocessor = await self._load_with_retries(record)
            entry.card_checksum = record.model_card_checksum
            entry.load_error = None
            log.info("Serving model model=%s workers=%d", entry.name, len(entry.workers))
        except Exception as e:  # any failure to load is reported on every request for this model
            entry.load_error = f"{type(e).__name__}: {e}"
            log.error(
                "Could not load model card model=%s worker=%s error=%s",
                entry.name,
                record.instance_id,
                entry.load_error,
            )
        finally:
            self._loads.pop(entry.name, None)
            self._changed_now()  # a failed load is retried when the next worker of the model registers

    async def _load_with_retries(self, record: InstanceRecord) -> Preprocessor:
        """A card being published while it is read can fail one read; try a few times, each bounded."""
        for attempt in range(1, CARD_LOAD_ATTEMPTS + 1):
            try:
                async with asyncio.timeout(self._load_timeout_s):
                    return await self._load_card(record)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if attempt == CARD_LOAD_ATTEMPTS:
                    raise
                log.warning("Retrying model card load model=%s attempt=%d error=%s", record.model, attempt, e)
                await asyncio.sleep(attempt)
        raise AssertionError("unreachable")

    async def run(self, events: AsyncIterator[InstanceEvent]) -> None:
        """Apply discovery events (``InstanceWatcher.events()``) until the iterator ends or is cancelled."""
        async for event in events:
            self.apply(event)

    async def close(self) -> None:
        await cancel_and_wait(*self._loads.values())
        self._loads.clear()

    # --- queries ------------------------------------------------------------------------------

    def get(self, model: str) -> ModelEntry | None:
        """The entry of a served model, or of an adapter's view; None when ``model`` names neither."""
        entry = self._models.get(model)
        if entry is not None or model in self.graph_models:
            return entry
        try:
            return self._adapter(model)
        except (AdapterNotFound, InvalidRequest):
            return None

    # --- LoRA adapters ---------------------------------------------------------------------------

    def _adapter(self, model: str) -> ModelEntry | None:
        """The view serving the adapter ``model`` names (None: it names none). Raises
        ``AdapterNotFound`` for an adapter a known model's workers do not hold, and ``InvalidRequest``
        for a name that several models' workers hold as an adapter."""
        found = resolve_adapter(model, {n: e.adapters.keys() for n, e in self._models.items()})
        if found is None:
            return None
        if isinstance(found, list):
            raise InvalidRequest(
                f"Models {', '.join(found)} each have a LoRA adapter named '{model}'; name the one you "
                f"want as '<model>:{model}' (e.g. '{found[0]}:{model}').",
                param="model",
                code="ambiguous_model",
            )
        base = self._models[found.base]
        if found.adapter not in base.adapters:
            raise AdapterNotFound(model, base.name, list(base.adapters))
        view = self._views.get(found)
        if view is None:
            view = ModelEntry(
                found.adapter,
                workers=holders(base.workers.values(), found.adapter),
                preprocessor=base.preprocessor,
                card_checksum=base.card_checksum,
                load_error=base.load_error,
                created=base.created,
                served_once=base.served_once,
                left_at=base.left_at,
                lora_name=found.adapter,
                base=base.name,
            )
            self._views[found] = view
        return view

    def adapter_listing(self) -> list[tuple[str, str, LoraAdapter]]:
        """(model, adapter) pairs ``/v1/models`` lists: every adapter of every listed model."""
        listed = set(self.listed())
        return [
            (name, base.name, adapter)
            for base in self._models.values()
            if base.name in listed
            for name, adapter in base.adapters.items()
        ]

    def _unservable(self, view: ModelEntry) -> str | None:
        """Why an adapter's view cannot serve a request now (None: it can)."""
        if view.can_serve():
            return None
        base = self._models[view.base or ""]
        return unserved_reason(view.lora_name or "", list(base.workers.values()), list(view.workers.values()))

    def entries(self) -> list[ModelEntry]:
        """Every model the registry knows of (with workers or not)."""
        return list(self._models.values())

    def has_worker(self, instance_id: str) -> bool:
        """Whether discovery lists this worker now (under any model)."""
        return any(instance_id in e.workers for e in self._models.values())

    def served(self) -> list[str]:
        """Models a request can be served for now."""
        return sorted(n for n, e in self._models.items() if e.ready())

    def keeps(self, model: str) -> bool:
        """Whether ``model`` is listed and its requests held although nobody may serve it now (see the
        module docstring)."""
        if model in self.graph_models:
            return True
        entry = self.get(model)
        if entry is not None and entry.base is not None:  # an adapter: kept with its model
            return self.keeps(entry.base)
        if entry is None or not entry.served_once:
            return False
        if entry.workers:
            return True
        return entry.left_at is not None and self._clock() - entry.left_at < self.retention_s

    def loading(self) -> list[str]:
        """Models whose first model card is loading (their tokenizer, chat template) while workers
        serve them: their requests are held until it has loaded (``/health`` waits for it)."""
        return sorted(n for n, e in self._models.items() if n in self._loads and e.preprocessor is None)

    def listed(self) -> list[str]:
        """Models ``/v1/models`` lists (and ``/health`` is ready with one): served or kept."""
        return sorted({*self.served(), *(n for n in self._models if self.keeps(n)), *self.graph_models})

    def created(self, model: str) -> int:
        """The ``created`` time of a listed model (first seen; a graph model never seen: the start)."""
        entry = self.get(model)
        return entry.created if entry is not None else self._started

    def admissible(self, model: str) -> bool:
        """True when a request for ``model`` may go ahead now; False when it is to be held until the model
        is served again (``serving.admission``): a kept model that nobody serves now, or one whose
        tokenizer is still loading. Raises the error that answers the request at once otherwise."""
        entry = self._models.get(model)
        if entry is not None and entry.preprocessor is not None and entry.can_serve():
            return True  # the common case, first
        if entry is None and model not in self.graph_models:
            view = self._adapter(model)
            if view is not None:
                return self._adapter_admissible(view)
        if entry is not None and entry.generates_images():
            self.lookup(model)  # the wrong endpoint
        if entry is not None and entry.can_serve():
            if entry.preprocessor is None and entry.load_error is not None:
                self.lookup(model)  # the card cannot be loaded
            return entry.preprocessor is not None
        if self.keeps(model):
            return False
        self.lookup(model)  # unknown (404), or nobody serves it (503)
        return True  # workers that cannot serve it alone: dispatch says which role is missing

    def _adapter_admissible(self, view: ModelEntry) -> bool:
        """``admissible`` of an adapter: served like its model, held while its model is held or while
        the adapter is being loaded on the workers of the other role; a 503 when it can never be."""
        assert view.base is not None
        base = self._models[view.base]
        if not base.workers:
            return self.admissible(view.base)  # scaling from zero: held (or answered) like the model
        why = self._unservable(view)
        if why is not None and "without LoRA" in why:
            raise ServiceUnavailable(f"Model '{view.name}' cannot be served: {why}.", code="lora_not_enabled")
        if why is not None:
            return False
        return self.admissible(view.base)

    def why_unserved(self, model: str) -> str:
        """Why nobody can serve ``model`` now, in words (for an answer that gave up waiting)."""
        entry = self._models.get(model)
        if entry is None:
            view = self.get(model)
            if view is not None and view.base is not None and self._models[view.base].workers:
                return self._unservable(view) or self.why_unserved(view.base)
            if view is not None and view.base is not None:
                return self.why_unserved(view.base)
        if entry is None or not entry.workers:
            return "no worker of it is registered"
        prefill, decode = entry.by_role("prefill"), entry.by_role("decode")
        if decode and not prefill and not entry.by_role("agg"):
            return f"it has {len(decode)} decode worker(s) but no prefill worker"
        if prefill and not decode and not entry.by_role("agg"):
            return f"it has {len(prefill)} prefill worker(s) but no decode worker"
        if not entry.can_serve():
            return "its prefill and decode workers are of different revisions (KV layouts)"
        return "its tokenizer is still loading"

    async def wait_changed(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    def lookup(self, model: str) -> ModelEntry:
        """The entry serving ``model``, or the error that tells the client why there is none."""
        entry = self._models.get(model)
        if entry is None and model not in self.graph_models:
            entry = self._adapter(model)
        if entry is None:
            served = self.listed()
            if not served and not any(e.workers for e in self._models.values()):
                raise ServiceUnavailable(
                    f"No worker is registered in namespace '{self.namespace}', so model '{model}' cannot be "
                    "served. Start a worker for it (or check the frontend's --namespace / --nats-server).",
                    code="no_workers",
                )
            raise ModelNotFound(model, served + [n for n, _, _ in self.adapter_listing()])
        if entry.base is not None and entry.workers and not entry.can_serve():
            raise ServiceUnavailable(
                f"Model '{model}' cannot be served now: {self._unservable(entry)}.",
                code="no_workers",
                headers={"Retry-After": "1"},
            )
        if not entry.workers:
            raise ServiceUnavailable(
                f"No worker serves model '{model}' right now (its workers left discovery). Retry when a "
                "worker has registered again.",
                code="no_workers",
            )
        if entry.generates_images():
            raise InvalidRequest(
                f"Model '{model}' generates images; send its requests to POST /v1/images/generations.",
                param="model",
                code="wrong_endpoint",
            )
        if entry.preprocessor is None:
            if entry.load_error is not None:
                raise ServiceUnavailable(
                    f"The tokenizer of model '{model}' could not be loaded from its model card "
                    f"({entry.load_error}). Check the worker's model folder; restarting a worker retries.",
                    code="model_loading_failed",
                )
            raise ServiceUnavailable(
                f"Model '{model}' is still loading its tokenizer; retry in a moment.",
                code="model_loading",
                headers={"Retry-After": "1"},
            )
        return entry
