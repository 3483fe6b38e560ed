"""NVIDIA Dynamo's module names map to ours: dynamo.frontend, dynamo.mocker and dynamo.planner always,
dynamo.sglang to the SGLang worker unless the image says DYN_SGLANG_ENGINE=mocker; a bad value or an
unknown Dynamo module is refused with a message naming what works."""

from __future__ import annotations

import pytest
from dynamo_worker.aliases import AliasError, resolve


def test_frontend_and_mocker_map_to_ours_whatever_the_engine():
    for env in ({}, {"DYN_SGLANG_ENGINE": "mocker"}):
        assert resolve("dynamo.frontend", env).module == "dynamo_worker.frontend"
        assert resolve("dynamo.mocker", env).module == "dynamo_worker.mocker"
        assert resolve("dynamo.planner", env).module == "dynamo_worker.planner"


def test_sglang_maps_to_the_engine_the_image_names():
    assert resolve("dynamo.sglang", {}).module == "dynamo_worker.sglang"
    assert resolve("dynamo.sglang", {"DYN_SGLANG_ENGINE": ""}).module == "dynamo_worker.sglang"
    assert resolve("dynamo.sglang", {"DYN_SGLANG_ENGINE": "sglang"}).module == "dynamo_worker.sglang"
    simulated = resolve("dynamo.sglang", {"DYN_SGLANG_ENGINE": "mocker"})
    assert simulated.module == "dynamo_worker.mocker"
    assert "simulated" in simulated.reason


def test_bad_engine_and_unknown_module_say_what_works():
    with pytest.raises(
        AliasError, match=r"DYN_SGLANG_ENGINE='vllm' is not an engine; set it to one of sglang, mocker"
    ):
        resolve("dynamo.sglang", {"DYN_SGLANG_ENGINE": "vllm"})
    with pytest.raises(
        AliasError, match=r"dynamo.vllm is NVIDIA Dynamo's .* dynamo.frontend, dynamo.mocker, dynamo.planner"
    ):
        resolve("dynamo.vllm", {})
