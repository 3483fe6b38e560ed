"""Frontend settings: flags beat env vars beat defaults, every knob has a flag and help, bad values
name the flag and env var (the command as a process: tests/integration/frontend/test_frontend_settings.py)."""

from __future__ import annotations

import pytest
from dynamo_worker.frontend.settings import FrontendSettings
from dynamo_worker.router.policy import KvWeights
from dynamo_worker.runtime.settings import SettingsError


def test_defaults():
    s = FrontendSettings.parse([], env={})
    assert (s.http_host, s.http_port, s.router_mode, s.kv_overlap_weight) == (
        "0.0.0.0",
        8000,
        "round-robin",
        3.0,
    )


def test_env_then_flags():
    env = {
        "DYN_HTTP_PORT": "9001",
        "DYN_ROUTER_MODE": "kv",
        "DYN_KV_OVERLAP_WEIGHT": "2.5",
        "DYN_NAMESPACE": "ns-env",
        "NATS_SERVER": "nats://h:1",
        "DYN_HTTP_MAX_INFLIGHT": "7",
    }
    s = FrontendSettings.parse([], env=env)
    assert (s.http_port, s.router_mode, s.kv_overlap_weight, s.namespace, s.nats_server, s.max_inflight) == (
        9001,
        "kv",
        2.5,
        "ns-env",
        "nats://h:1",
        7,
    )
    s = FrontendSettings.parse(
        ["--http-port", "9002", "--router-mode", "random", "--namespace", "x"], env=env
    )
    assert (s.http_port, s.router_mode, s.namespace) == (9002, "random", "x")


def test_bad_value_names_flag_and_env():
    with pytest.raises(SettingsError) as e:
        FrontendSettings.parse([], env={"DYN_KV_OVERLAP_WEIGHT": "-1"})
    assert "--kv-overlap-weight" in str(e.value) and "DYN_KV_OVERLAP_WEIGHT" in str(e.value)


def test_every_field_has_a_flag_with_help():
    text = FrontendSettings.parser().format_help()
    for name, info in FrontendSettings.model_fields.items():
        assert "--" + name.replace("_", "-") in text
        assert info.description


def test_dynamo_flag_alias_and_unknown_flags_are_returned():
    s, unknown = FrontendSettings.parse_known(
        ["--kv-overlap-score-weight", "3", "--router-temperature", "0.5", "--http-port", "1"], env={}
    )
    assert s.kv_overlap_weight == 3.0 and s.http_port == 1
    assert unknown == ["--router-temperature", "0.5"]
    newer, _ = FrontendSettings.parse_known(["--router-kv-overlap-score-weight", "0"], env={})
    assert newer.kv_overlap_weight == 0.0, "Dynamo's newer name for the same weight"


def test_every_kv_knob_is_a_flag_with_the_policys_default():
    assert FrontendSettings.parse([]).kv_weights() == KvWeights()
    given = FrontendSettings.parse(["--kv-lora-wait-blocks", "7", "--kv-overlap-score-weight", "2"])
    assert given.kv_weights() == KvWeights(lora_wait_blocks=7.0, overlap_weight=2.0)
