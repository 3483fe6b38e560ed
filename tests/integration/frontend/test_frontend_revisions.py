"""Revision-coherent prefill/decode pairs with real mocker workers: workers of different page sizes
publish different revisions, the frontend never pairs them (the mocker would refuse the handover, as
SGLang would misbehave), a revision with one role only is named in the frontend's log and its
``dynamo_frontend_unpaired_workers`` gauge and gets no traffic, and a model whose only pairs are mixed
answers 503 naming the revisions; the newest complete revision serves during a rollout."""

from __future__ import annotations

import re

import aiohttp
import openai
import pytest

from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

MODEL = "tiny"


def client(fe) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0, timeout=30)


async def unpaired(fe) -> dict[tuple[str, str], float]:
    """The frontend's ``dynamo_frontend_unpaired_workers`` series, read from its /metrics."""
    async with aiohttp.ClientSession() as http, http.get(fe.url + "/metrics") as r:
        text = await r.text()
    pattern = r'^dynamo_frontend_unpaired_workers\{model="tiny",revision="([^"]+)",role="(\w+)"\} (\S+)$'
    return {(rev, role): float(n) for rev, role, n in re.findall(pattern, text, re.M)}


async def test_workers_of_different_layouts_are_never_paired(mockers, frontend_factory, wait_workers, caplog):
    old_p, new_d = mockers("prefill", "--page-size", "4"), mockers("decode", "--page-size", "8")
    fe = await frontend_factory()
    await wait_workers(fe, 2, mockers=[old_p, new_d])
    async with client(fe) as c:
        with pytest.raises(openai.APIStatusError) as e:
            await c.completions.create(model=MODEL, prompt="hello", max_tokens=4)
        assert e.value.status_code == 503
        body = e.value.body
        assert isinstance(body, dict) and body["code"] == "no_matching_revision"
        assert "share a revision" in body["message"]
        gauge = await unpaired(fe)
        assert sorted(role for _, role in gauge) == ["decode", "prefill"]
        assert all(n == 1 for n in gauge.values())
        assert "Revision has prefill workers but no decode worker" in caplog.text

        # the new revision gets its prefill worker: it pairs, the old prefill worker is left alone
        new_p = mockers("prefill", "--page-size", "8")
        await wait_workers(fe, 3, mockers=[old_p, new_d, new_p])
        old_revision = next(rev for rev, role in gauge if role == "prefill")

        async def only_old_prefill_unpaired() -> bool:
            return await unpaired(fe) == {(old_revision, "prefill"): 1.0}

        await wait_until_async(only_old_prefill_unpaired, "only the old prefill unpaired", timeout_s=10)
        for _ in range(12):  # round-robin would send half of these to the old prefill worker
            out = await c.completions.create(
                model=MODEL, prompt="hello there", max_tokens=4, extra_body={"ignore_eos": True}
            )
            assert out.choices[0].finish_reason == "length"
    assert "KV layout mismatch" not in old_p.log() + new_p.log() + new_d.log()
    assert "dynamo_worker_requests_total{" not in old_p.metrics()  # the old prefill worker got no leg


async def test_the_newest_complete_revision_serves_during_a_rollout(
    mockers, frontend_factory, wait_workers, wait_warm
):
    old = [mockers("prefill", "--page-size", "4"), mockers("decode", "--page-size", "4")]
    fe = await frontend_factory()
    await wait_workers(fe, 2, mockers=old)
    new = [mockers("prefill", "--page-size", "8"), mockers("decode", "--page-size", "8")]
    await wait_workers(fe, 4, mockers=old + new)
    await wait_warm(fe, 2)  # until then the old revision's warm pair serves (serving.warmup)
    async with client(fe) as c:
        for _ in range(6):
            out = await c.completions.create(
                model=MODEL, prompt="hello there", max_tokens=4, extra_body={"ignore_eos": True}
            )
            assert out.choices[0].finish_reason == "length"

    def served(m) -> float:
        found = re.search(r'^dynamo_worker_requests_total\{outcome="length"\} (\S+)$', m.metrics(), re.M)
        return float(found.group(1)) if found else 0.0

    # the new revision's decode worker served all (it counts a request as it ends, maybe after the client)
    # (and each decode worker its pair's warm-up)
    await wait_until_async(lambda: served(new[1]) == 7, "the new decode worker to count 6", timeout_s=10)
    assert served(old[1]) == 1
