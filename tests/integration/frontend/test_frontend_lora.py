"""LoRA adapters through the frontend with the official ``openai`` client, on mocker workers and a real
nats-server: ``/v1/models`` lists each adapter with its source and its model; a request names an
adapter by its name or as ``<model>:<adapter>`` and is served only by workers that hold it (a worker
refuses an adapter it lacks, so a request routed to the wrong one would fail), also disaggregated, where
it waits while the adapter is on the prefill worker only; an unknown adapter is a 404 naming the ones
there are, and so is an unloaded one; adapter KV routing caches as much as base-model routing."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import aiohttp
import openai
import pytest
from dynamo_worker.frontend.models.preprocessor import Preprocessor
from dynamo_worker.protocol import hash_token_blocks

from tests.support.peft_adapters import write_adapter
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

MODEL = "tiny"
PAGE = 4
LORA = ("--enable-lora", "--max-lora-rank", "16", "--lora-target-modules", "all", "--lora-load-ms", "1")


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory, tiny_model) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {f"a{i}": write_adapter(tiny_model, root / f"a{i}", rank=8, seed=i) for i in range(1, 5)}


async def lora_call(mocker, method: str, path: str, body: dict | None = None) -> dict:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, f"http://127.0.0.1:{mocker.system_port}{path}", json=body) as r,
    ):
        answer = await r.json()
        assert r.status == 200, answer
        return answer


async def load(mocker, name: str, folder: Path) -> None:
    await lora_call(mocker, "POST", "/v1/loras", {"lora_name": name, "source": {"uri": f"file://{folder}"}})


async def served(fe, model: str, within_s: float = 10.0) -> None:
    """Until the frontend can serve ``model`` (an adapter: some worker set holds it)."""

    def ready() -> bool:
        entry = fe.registry.get(model)
        return entry is not None and entry.ready()

    await wait_until_async(ready, f"the frontend to serve {model}", timeout_s=within_s)


def client(fe) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=30)


async def test_adapters_are_listed_and_served_only_by_workers_that_hold_them(
    mockers, frontend_factory, wait_workers, adapter_dirs
):
    one, two = mockers("null", *LORA, speedup=100.0), mockers("null", *LORA, speedup=100.0)
    fe = await frontend_factory(router_mode="round-robin")
    await wait_workers(fe, 2, mockers=[one, two])
    await load(one, "a1", adapter_dirs["a1"])  # on one worker only
    await load(one, "a2", adapter_dirs["a2"])
    await load(two, "a2", adapter_dirs["a2"])
    await served(fe, "a1")
    await served(fe, "a2")
    async with client(fe) as c:
        models = {m.id: m for m in (await c.models.list()).data}
        assert set(models) == {MODEL, "a1", "a2"}
        a1 = models["a1"].model_dump()
        assert (a1["root"], a1["parent"]) == (f"file://{adapter_dirs['a1']}", MODEL)
        assert "parent" not in models[MODEL].model_dump() or models[MODEL].model_dump()["parent"] is None

        base = await c.completions.create(model=MODEL, prompt="hello adapters", max_tokens=6, temperature=0)
        answers = set()
        for model in ["a1", f"{MODEL}:a1"] * 3:  # round-robin would alternate: only worker one holds a1
            r = await c.completions.create(model=model, prompt="hello adapters", max_tokens=6, temperature=0)
            assert r.model == model and r.choices[0].finish_reason == "length"
            answers.add(r.choices[0].text)
        assert len(answers) == 1 and answers != {base.choices[0].text}
        chat = await c.chat.completions.create(
            model="a2", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert chat.choices[0].message.content  # the model's chat template serves its adapters

        with pytest.raises(openai.NotFoundError) as unknown:
            await c.completions.create(model=f"{MODEL}:a9", prompt="x", max_tokens=2)
        assert "Its adapters: a1, a2" in unknown.value.message
        with pytest.raises(openai.NotFoundError) as bare:
            await c.completions.create(model="a9", prompt="x", max_tokens=2)
        assert "a1" in bare.value.message and bare.value.code == "model_not_found"

        await lora_call(one, "DELETE", "/v1/loras/a1")
        await wait_until_async(
            lambda: fe.registry.get("a1") is None, "a1 gone from the frontend", timeout_s=10
        )
        with pytest.raises(openai.NotFoundError):
            await c.completions.create(model="a1", prompt="x", max_tokens=2)
        assert "a1" not in {m.id for m in (await c.models.list()).data}


async def test_disaggregated_adapter_requests_go_to_a_pair_that_holds_the_adapter(
    mockers, frontend_factory, wait_workers, adapter_dirs
):
    prefill, decode = mockers("prefill", *LORA), mockers("decode", *LORA)
    fe = await frontend_factory()
    await wait_workers(fe, 2, mockers=[prefill, decode])
    for m in (prefill, decode):
        await load(m, "a1", adapter_dirs["a1"])
    await served(fe, "a1")
    await load(prefill, "a2", adapter_dirs["a2"])  # not on decode yet
    await wait_until_async(lambda: fe.registry.get("a2") is not None, "a2 known", timeout_s=10)
    async with client(fe) as c:
        for model in ("a1", f"{MODEL}:a1"):
            r = await c.completions.create(model=model, prompt="split legs", max_tokens=5, temperature=0)
            assert r.choices[0].finish_reason == "length"
        # a2 is held (bounded) while only the prefill worker has it ...
        with pytest.raises(openai.APIStatusError) as held:
            await c.completions.create(
                model="a2", prompt="x", max_tokens=2, extra_headers={"x-llm-d-inference-ttl": "0.5s"}
            )
        assert held.value.status_code == 503 and "no decode worker" in held.value.message
        # ... and served once the decode worker has it too
        waiting = asyncio.create_task(c.completions.create(model="a2", prompt="wait", max_tokens=3))
        await wait_until_async(
            lambda: fe.server.admission.waiting("a2") == 1, "the a2 request held", timeout_s=10
        )
        await load(decode, "a2", adapter_dirs["a2"])
        r = await asyncio.wait_for(waiting, 20)
        assert r.choices[0].finish_reason == "length"


def workload(tag: str, adapters: list[str | None], prefixes: int, repeats: int = 3):
    """(adapter, prompt) requests: each adapter with the same ``prefixes`` shared prefixes (fine-tunes of
    one model share its system prompts), each prefix ``repeats`` times, shuffled."""
    words = ["alpha", "beta", "gamma", "delta", "robot", "paint", "cache", "block", "prefix", "decode"]
    rng = random.Random(tag)
    texts = [f"{tag} system {p}: " + " ".join(rng.choice(words) for _ in range(100)) for p in range(prefixes)]
    out = [(a, f"{text} question {q}?") for a in adapters for text in texts for q in range(repeats)]
    rng.shuffle(out)
    return out


async def cached_share(fe, requests, pre: Preprocessor) -> float:
    cached = total = 0
    async with client(fe) as c:
        for adapter, prompt in requests:
            r = await c.completions.create(model=adapter or MODEL, prompt=prompt, max_tokens=2)
            details = r.usage.prompt_tokens_details
            cached += details.cached_tokens if details else 0
            total += r.usage.prompt_tokens
            hashes = hash_token_blocks(pre.encode_prompt(prompt), PAGE, lora_name=adapter)
            await wait_until_async(  # this request's KV events reach the router before the next one
                lambda h=hashes: (
                    max(fe.router.index.overlaps(h, fe.router.index.targets()).values()) >= len(h)
                ),
                "the request's KV events to reach the router",
                timeout_s=10,
            )
    return cached / total


async def test_adapter_kv_routing_caches_as_much_as_base_model_routing(
    mockers, frontend_factory, wait_workers, adapter_dirs, tiny_model
):
    ms = [mockers("null", *LORA, speedup=100.0) for _ in range(3)]
    fe = await frontend_factory(router_mode="kv")
    await wait_workers(fe, 3, mockers=ms)
    names = sorted(adapter_dirs)
    for m in ms:
        for name in names:
            await load(m, name, adapter_dirs[name])
    for name in names:
        await served(fe, name)
    pre = Preprocessor.from_dir(tiny_model)
    base = await cached_share(fe, workload("base", [None], prefixes=8), pre)  # 8 prefixes
    lora = workload("lora", list(names), prefixes=2)  # 4 adapters x 2 shared prefixes: 8 namespaced ones
    adapters = await cached_share(fe, lora, pre)
    print(f"cached share: base model {base:.2f}, 4 adapters {adapters:.2f}")
    assert base > 0.55
    assert adapters >= base - 0.05
    # the router keys the adapters' blocks on tokens and adapter: none of them is a base-model block
    index, ids = fe.router.index, pre.encode_prompt(lora[0][1])
    assert (
        max(index.overlaps(hash_token_blocks(ids, PAGE, lora_name=lora[0][0]), index.targets()).values()) > 0
    )
    assert max(index.overlaps(hash_token_blocks(ids, PAGE), index.targets()).values()) == 0
