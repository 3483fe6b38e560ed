"""LoRA adapters as models in the frontend's registry, fed with discovery records: a name or
``<model>:<adapter>`` resolves to a view of the model with only the workers holding the adapter (its
tokenizer and parsers the model's); an unknown adapter of a known model is a 404 naming its adapters;
a name several models hold as an adapter asks for the qualified form; a disaggregated adapter is
served only by a prefill and decode pair of one revision that both hold it, held while one role lacks
it, and refused at once when that role runs without LoRA; adapters are remembered while the model has
no worker; ``/v1/models`` lists them with their source and model."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from dynamo_worker.frontend.errors import AdapterNotFound, InvalidRequest, ServiceUnavailable
from dynamo_worker.frontend.models.lora_adapters import AdapterName, resolve_adapter, split_base
from dynamo_worker.frontend.models.preprocessor import Preprocessor
from dynamo_worker.frontend.models.registry import ModelRegistry
from dynamo_worker.protocol import InstanceRecord, LoraAdapter, LoraState
from dynamo_worker.router import Router
from dynamo_worker.runtime.discovery import InstanceAdded, InstanceRemoved

_ids = itertools.count(1)


def worker(
    role: str = "agg", adapters: tuple[str, ...] | None = (), model: str = "m", revision: str = "r"
) -> InstanceRecord:
    i = next(_ids)
    lora = None
    if adapters is not None:
        lora = LoraState(adapters=[LoraAdapter(name=a, uri=f"file:///lora/{a}", rank=8) for a in adapters])
    return InstanceRecord(
        instance_id=f"{i:016x}",
        namespace="ns",
        component=role,
        role=role,
        model=model,
        address=f"127.0.0.1:{3000 + i}",
        page_size=4,
        total_kv_blocks=10,
        max_running_requests=4,
        revision=revision,
        lora=lora,
    )


@pytest.fixture
async def registry(model_dir):
    async def load(_: InstanceRecord) -> Preprocessor:
        return Preprocessor.from_dir(model_dir)

    reg = ModelRegistry(Router("round-robin"), load, "ns", load_timeout_s=10, retention_s=600)
    yield reg
    await reg.close()


async def serve(reg: ModelRegistry, *workers: InstanceRecord, model: str = "m") -> None:
    for w in workers:
        reg.apply(InstanceAdded(w))
    async with asyncio.timeout(10):
        while not reg.admissible(model):
            await reg.wait_changed()


def test_names_of_adapters():
    assert split_base("llama:3b:a1", {"llama:3b"}) == AdapterName("llama:3b", "a1")
    assert split_base("m:", {"m"}) is None
    assert resolve_adapter("a1", {"m": {"a1"}, "n": set()}) == AdapterName("m", "a1")
    assert resolve_adapter("m:zz", {"m": {"a1"}}) == AdapterName("m", "zz")  # the caller says it lacks it
    assert resolve_adapter("a1", {"m": {"a1"}, "n": {"a1"}}) == ["m", "n"]
    assert resolve_adapter("zz", {"m": {"a1"}}) is None


async def test_an_adapter_is_a_view_of_its_model_with_the_workers_that_hold_it(registry):
    one, two = worker(adapters=("a1", "a2")), worker(adapters=("a2",))
    await serve(registry, one, two)
    for name in ("a1", "m:a1"):
        view = registry.lookup(name)
        assert (view.lora_name, view.base, list(view.workers)) == ("a1", "m", [one.instance_id])
        assert view.preprocessor is registry.get("m").preprocessor  # the model's template and parsers
    assert set(registry.lookup("a2").workers) == {one.instance_id, two.instance_id}
    assert registry.lookup("m").lora_name is None
    with pytest.raises(AdapterNotFound) as unknown:
        registry.lookup("m:a9")
    assert unknown.value.status == 404 and "Its adapters: a1, a2" in unknown.value.message
    listing = {(name, base, a.uri) for name, base, a in registry.adapter_listing()}
    assert listing == {("a1", "m", "file:///lora/a1"), ("a2", "m", "file:///lora/a2")}


async def test_an_adapter_two_models_hold_needs_the_qualified_name(registry):
    await serve(registry, worker(adapters=("a1",)))
    await serve(registry, worker(adapters=("a1",), model="n"), model="n")
    with pytest.raises(InvalidRequest, match="'m:a1'"):
        registry.lookup("a1")
    assert registry.lookup("n:a1").base == "n"


async def test_a_disaggregated_adapter_needs_a_pair_of_one_revision_that_both_hold_it(registry):
    prefill, decode = worker("prefill", ("a1", "a2")), worker("decode", ("a1",))
    old_decode = worker("decode", ("a2",), revision="old")
    await serve(registry, prefill, decode, old_decode)
    pair = registry.lookup("a1").pair()
    assert pair is not None and (pair.prefill, pair.decode) == ((prefill,), (decode,))
    assert registry.admissible("a2") is False  # held: no decode worker of revision r has it yet
    assert "no decode worker of the same revision" in registry.why_unserved("a2")
    updated = decode.model_copy(
        update={"lora": LoraState(adapters=[*decode.lora.adapters, prefill.lora.adapters[1]])}
    )
    registry.apply(InstanceAdded(updated))
    assert registry.admissible("a2") is True


async def test_an_adapter_the_other_role_cannot_load_is_refused_at_once(registry):
    await serve(registry, worker("prefill", ("a1",)), worker("decode", None))
    with pytest.raises(ServiceUnavailable) as e:
        registry.admissible("a1")
    assert e.value.code == "lora_not_enabled" and "--enable-lora" in e.value.message


async def test_adapters_are_remembered_while_their_model_has_no_worker(registry):
    w = worker(adapters=("a1",))
    await serve(registry, w)
    registry.apply(InstanceRemoved(w.instance_id, w))
    assert registry.keeps("a1") and registry.admissible("a1") is False  # held like its model
    registry.apply(InstanceAdded(worker(adapters=())))  # back, without the adapter: it is gone
    with pytest.raises(AdapterNotFound):
        registry.admissible("m:a1")
    assert registry.get("a1") is None
