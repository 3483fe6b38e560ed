"""RuntimeSettings and the CLI derived from settings models: flag beats env beats default, aliases,
switches, and errors that name the flag and the env var to fix."""

from __future__ import annotations

import argparse
from typing import Literal

import pytest
from dynamo_api.settings_sources import Settings
from dynamo_worker.runtime.settings import (
    RuntimeSettings,
    SettingsError,
    add_model_arguments,
    settings_from_args,
)
from pydantic import Field
from pydantic_settings import CliSuppress, SettingsConfigDict


def test_defaults_without_env_or_flags():
    s = RuntimeSettings.parse([], env={})
    assert (s.namespace, s.component, s.endpoint) == ("dynamo", "backend", "generate")
    assert (s.system_port, s.request_port, s.discovery_ttl) == (9090, 9100, 10.0)
    assert len(s.instance_id) == 16
    assert RuntimeSettings.parse([], env={}).instance_id != s.instance_id


def test_flag_beats_env_beats_default():
    env = {"DYN_NAMESPACE": "from-env", "DYN_COMPONENT": "decode", "NATS_SERVER": "nats://n:4222"}
    s = RuntimeSettings.parse(["--namespace", "from-flag", "--system-port", "0"], env=env)
    assert s.namespace == "from-flag"
    assert s.component == "decode"
    assert s.nats_server == "nats://n:4222"
    assert s.system_port == 0


def test_advertise_host_falls_back_to_the_pod_ip():
    assert RuntimeSettings.parse([], env={"POD_IP": "10.1.2.3"}).advertise_host == "10.1.2.3"
    env = {"POD_IP": "10.1.2.3", "DYN_ADVERTISE_HOST": "worker-0.svc"}
    assert RuntimeSettings.parse([], env=env).advertise_host == "worker-0.svc"
    env = {"POD_IP": "10.1.2.3", "DYN_ADVERTISE_HOST": ""}  # empty counts as unset
    assert RuntimeSettings.parse([], env=env).advertise_host == "10.1.2.3"
    assert RuntimeSettings.parse([], env={"advertise_host": "x", "namespace": "y"}).namespace == "dynamo"


def test_invalid_values_name_the_flag_and_env_var():
    with pytest.raises(SettingsError, match="--discovery-ttl / DYN_DISCOVERY_TTL"):
        RuntimeSettings.parse([], env={"DYN_DISCOVERY_TTL": "0.1"})
    with pytest.raises(SettingsError, match="--namespace"):
        RuntimeSettings.parse(["--namespace", "a.b"], env={})


def test_system_can_be_disabled_by_env_or_switch():
    assert RuntimeSettings.parse([], env={"DYN_SYSTEM_ENABLED": "false"}).system_enabled is False
    assert RuntimeSettings.parse(["--no-system-enabled"], env={}).system_enabled is False


class _Demo(Settings):
    model_config = SettingsConfigDict(cli_shortcuts={"tp-size": "tp"})

    mode: Literal["a", "b"] = Field("a", description="mode")
    tp_size: int = Field(1, description="tp")
    verbose: bool = Field(False, description="switch")
    hidden: CliSuppress[int] = Field(3)


def test_aliases_choices_and_switches():
    parser = argparse.ArgumentParser()
    add_model_arguments(parser, _Demo)
    s = settings_from_args(_Demo, parser.parse_args(["--tp", "4", "--verbose", "--mode", "b"]), {})
    assert (s.tp_size, s.verbose, s.mode, s.hidden) == (4, True, "b", 3)
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "c"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--hidden", "1"])
    assert "tp" in parser.format_help()


class _Required(Settings):
    url: str = Field(description="Where to send requests.", json_schema_extra={"env": "DEMO_URL"})
    mode: Literal["a", "b"] = Field("a", description="A mode.")


def test_required_fields_and_choices_read_plainly_in_help_and_errors():
    parser = argparse.ArgumentParser()
    add_model_arguments(parser, _Required)
    text = " ".join(parser.format_help().split())
    assert "Where to send requests. [env DEMO_URL] (required)" in text
    assert "PydanticUndefined" not in text
    assert "--mode {a,b}" in text
    with pytest.raises(SettingsError, match=r"--url / DEMO_URL is required"):
        settings_from_args(_Required, parser.parse_args([]), {})
