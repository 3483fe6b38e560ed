"""The /v1/loras contract read by the operator and dynamo-run: listings, refusals (the worker's reason
and message, or the HTTP status of an answer outside the contract), the same source written two ways,
LoRA flags; and which services of a graph serve a base model (modelRef wins over the served name)."""

from __future__ import annotations

import pytest
from dynamo_api.components import components
from dynamo_api.loras import (
    adapter_services,
    base_model_of,
    load_body,
    lora_enabled,
    parse_listing,
    parse_refusal,
    same_source,
)
from dynamo_api.models import DynamoGraphDeployment


def test_a_listing_is_read_by_name():
    held = parse_listing(
        {
            "status": "success",
            "loras": [
                {"lora_name": "a", "uri": "file:///x/a", "rank": 8, "pinned": True},
                {"lora_name": "b"},
            ],
            "count": 2,
        }
    )
    assert held["a"].uri == "file:///x/a" and held["a"].rank == 8 and held["a"].pinned
    assert held["b"].uri == "" and held["b"].rank is None
    with pytest.raises(ValueError, match="loras"):
        parse_listing({"status": "success"})
    assert load_body("a", "hf://o/r") == {"lora_name": "a", "source": {"uri": "hf://o/r"}, "pinned": False}


def test_refusals_keep_the_workers_reason_and_say_when_the_answer_is_outside_the_contract():
    refusal = parse_refusal(
        400, {"status": "error", "reason": "RankTooLarge", "message": "raise --max-lora-rank"}
    )
    assert (refusal.reason, refusal.message, refusal.permanent) == (
        "RankTooLarge",
        "raise --max-lora-rank",
        True,
    )
    assert not parse_refusal(503, {"reason": "SourceUnreachable", "message": "m"}).permanent
    # a worker under --load-format dummy can load no adapter until it is restarted with real weights
    assert parse_refusal(400, {"reason": "LoraNotSupported", "message": "use --load-format auto"}).permanent
    other = parse_refusal(502, "Bad Gateway")
    assert other.reason == "Http502" and "502" in other.message and not other.permanent


def test_same_source():
    assert same_source("file:///a/b/", "/a/b") and same_source("file:///a/b", "file:///a/b")
    assert same_source("", "file:///a")  # the worker does not say
    assert not same_source("file:///a/b", "file:///a/c") and not same_source("hf://o/r@1", "hf://o/r@2")


def test_lora_is_enabled_by_either_flag():
    assert lora_enabled(["--enable-lora", "--max-lora-rank", "8"])
    assert lora_enabled(["--lora-paths", "a=/x"])
    assert not lora_enabled(["--model-path", "m"])


def graph(services: dict) -> DynamoGraphDeployment:
    return DynamoGraphDeployment.model_validate({"metadata": {"name": "g"}, "spec": {"services": services}})


def worker(model: str, *extra: str, **spec: object) -> dict:
    args = ["--model-path", f"/models/{model}", "--served-model-name", model, *extra]
    return {"componentType": "worker", **spec, "extraPodSpec": {"mainContainer": {"args": args}}}


def test_language_workers_serving_the_base_model_are_the_targets():
    dgd = graph(
        {
            "Frontend": {"componentType": "frontend"},
            "prefill": worker("m", subComponentType="prefill"),
            "decode": worker("m", subComponentType="decode"),
            "other": worker("n"),
            "encoder": worker("m", "--role", "encode"),
        }
    )
    assert [c.name for c in adapter_services(dgd, "m")] == ["decode", "prefill"]
    assert [c.name for c in adapter_services(dgd, "n")] == ["other"]
    assert adapter_services(dgd, "absent") == []


def test_model_ref_wins_over_the_served_name():
    dgd = graph({"decode": worker("served-name", modelRef={"name": "org/base"}), "plain": worker("org/base")})
    by_name = {c.name: base_model_of(c) for c in components(dgd)}
    assert by_name == {"decode": "org/base", "plain": "org/base"}
    assert [c.name for c in adapter_services(dgd, "served-name")] == []
    no_served = graph(
        {
            "w": {
                "componentType": "worker",
                "extraPodSpec": {"mainContainer": {"args": ["--model-path", "/m/x"]}},
            }
        }
    )
    assert base_model_of(components(no_served)[0]) == "/m/x"
