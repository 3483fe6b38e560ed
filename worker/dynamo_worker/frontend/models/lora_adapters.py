"""LoRA adapters as models: which name asks for which adapter of which served model, and which workers
may serve it. Pure.

Workers publish the adapters they hold in discovery (``InstanceRecord.lora``). A request selects an
adapter as SGLang's server lets it: ``model`` is the adapter's name, or ``<base>:<adapter>`` (the
served model, a colon, the adapter). A served model's name wins over an adapter of the same name.

The adapter is served as a view of its base model (``adapter_entry``): the base's tokenizer, chat
template and parsers (its model card), and only the base's workers that hold the adapter. Dispatch and
pairing work on that view unchanged, so a disaggregated request goes only to a prefill and a decode
worker of one revision that both hold the adapter.

What a base model's workers hold is kept on its entry (``held_adapters``), and remembered while it has
no worker (scaling from zero, a restart), so that its adapters' requests are held like the base's.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from dynamo_worker.protocol import InstanceRecord, LoraAdapter

__all__ = [
    "AdapterName",
    "held_adapters",
    "holders",
    "resolve_adapter",
    "split_base",
    "unserved_reason",
]


@dataclass(frozen=True)
class AdapterName:
    """An adapter of a served model, as a request names it."""

    base: str
    adapter: str

    @property
    def qualified(self) -> str:
        return f"{self.base}:{self.adapter}"


def held_adapters(workers: Iterable[InstanceRecord]) -> dict[str, LoraAdapter]:
    """The adapters any of ``workers`` holds, by name (the first worker's record of each)."""
    out: dict[str, LoraAdapter] = {}
    for w in workers:
        for a in w.lora.adapters if w.lora is not None else ():
            out.setdefault(a.name, a)
    return dict(sorted(out.items()))


def holders(workers: Iterable[InstanceRecord], adapter: str) -> dict[str, InstanceRecord]:
    """The workers among ``workers`` that hold ``adapter``, by instance id."""
    return {w.instance_id: w for w in workers if w.lora is not None and w.lora.holds(adapter)}


def split_base(model: str, bases: Collection[str]) -> AdapterName | None:
    """``<base>:<adapter>`` with a known base (a base name may hold colons itself), else None."""
    for i, ch in enumerate(model):
        if ch == ":" and model[:i] in bases and model[i + 1 :]:
            return AdapterName(model[:i], model[i + 1 :])
    return None


def resolve_adapter(model: str, adapters: Mapping[str, Collection[str]]) -> AdapterName | list[str] | None:
    """The adapter ``model`` names, given each base model's adapters: an ``AdapterName``; the bases
    that hold an adapter of that name when several do (ambiguous: the caller asks for
    ``base:adapter``); None when ``model`` names no adapter (an unknown adapter of a known base is an
    ``AdapterName`` whose adapter that base lacks: the caller says which it has)."""
    qualified = split_base(model, adapters.keys())
    if qualified is not None:
        return qualified
    bases = sorted(b for b, names in adapters.items() if model in names)
    if len(bases) == 1:
        return AdapterName(bases[0], model)
    return bases or None


def unserved_reason(
    name: str, workers: Collection[InstanceRecord], holding: Collection[InstanceRecord]
) -> str:
    """Why the workers holding adapter ``name`` cannot serve it together, and whether they ever can
    (a role whose workers run without LoRA never will): for a 503 or a held request's message."""
    roles = {w.role for w in holding}
    missing = "decode" if "prefill" in roles else "prefill" if "decode" in roles else "aggregated or prefill"
    if not holding:
        return f"no worker holds adapter {name!r} now"
    lacking = [w for w in workers if w.role == missing or (missing.startswith("agg") and w.role == "agg")]
    held_by = ", ".join(f"{sum(w.role == r for w in holding)} {r}" for r in sorted(roles))
    if lacking and all(w.lora is None for w in lacking):
        return (
            f"adapter {name!r} is loaded on {held_by} worker(s), and the {missing} workers run without LoRA "
            f"(--enable-lora): start them with it, with the same --max-lora-rank and --lora-target-modules"
        )
    return (
        f"adapter {name!r} is loaded on {held_by} worker(s) but on no {missing} worker of the same revision "
        "(a disaggregated request needs it on both): load it there (POST /v1/loras, or its DynamoModel)"
    )
