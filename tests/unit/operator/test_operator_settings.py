"""Operator settings: every field is a flag and an environment variable (flags win), the scope must be
chosen explicitly, bad values name the flag and variable, and pod defaults come from OperatorConfig
(`python -m dynamo_operator` as a process: tests/integration/operator/test_operator_settings.py)."""

from pathlib import Path

import pytest
import yaml
from dynamo_api import contract
from dynamo_operator.config import OperatorConfig
from dynamo_operator.settings import SettingsError, parse_settings


def test_flags_win_over_environment_and_defaults_come_from_operator_config():
    env = {
        "DYN_OPERATOR_NAMESPACE": "a,b",
        "DYN_OPERATOR_WORKERS": "3",
        "DYN_OPERATOR_NATS_URL": "nats://x:1",
    }
    s = parse_settings(["--workers", "5", "--group-backend", "lws"], env)
    assert s.namespace == ("a", "b")
    assert s.workers == 5
    assert s.group_backend == "lws"
    assert s.nats_url == "nats://x:1"
    assert s.frontend_image == OperatorConfig().frontend_image
    assert parse_settings(["--all-namespaces"], {"dyn_operator_workers": "3"}).workers == 8  # upper case only
    config = s.operator_config("lws")
    assert config == OperatorConfig(nats_url="nats://x:1", group_backend="lws")


def test_repeated_namespace_flag_and_all_namespaces():
    assert parse_settings(["--namespace", "a", "--namespace", "b"], {}).namespace == ("a", "b")
    s = parse_settings(["--all-namespaces"], {})
    assert s.all_namespaces and s.namespace == ()


@pytest.mark.parametrize("argv", [[], ["--namespace", "a", "--all-namespaces"]])
def test_scope_must_be_chosen_once(argv):
    with pytest.raises(SettingsError, match=r"--namespace NAME .* or --all-namespaces"):
        parse_settings(argv, {})


def test_bad_values_name_flag_and_variable():
    with pytest.raises(SettingsError, match="--workers / DYN_OPERATOR_WORKERS"):
        parse_settings(["--namespace", "a"], {"DYN_OPERATOR_WORKERS": "zero"})
    with pytest.raises(SettingsError, match="DYN_OPERATOR_ALL_NAMESPACES='maybe' is not a boolean"):
        parse_settings([], {"DYN_OPERATOR_ALL_NAMESPACES": "maybe"})


def test_in_cluster_detection():
    s = parse_settings(["--namespace", "a"], {})
    assert s.use_in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert not s.use_in_cluster({})
    with_kubeconfig = parse_settings(["--namespace", "a", "--kubeconfig", "/k"], {})
    assert not with_kubeconfig.use_in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert parse_settings(["--namespace", "a", "--in-cluster"], {}).use_in_cluster({})
    forced_off = parse_settings(["--namespace", "a", "--no-in-cluster"], {"DYN_OPERATOR_IN_CLUSTER": "true"})
    assert not forced_off.use_in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"})


def test_liveness_endpoint():
    assert parse_settings(["--namespace", "a"], {}).liveness_endpoint == "http://0.0.0.0:8080/healthz"
    assert parse_settings(["--namespace", "a", "--liveness-port", "0"], {}).liveness_endpoint is None


def test_webhook_address_service_or_url():
    """The chart names a Service; a local run gets a 127.0.0.1 URL; both at once is refused."""
    chart = parse_settings(["--all-namespaces", "--webhook-service", "dynamo/op-webhook:443"], environ={})
    assert chart.webhook_client_config() == {
        "service": {"namespace": "dynamo", "name": "op-webhook", "path": "/convert", "port": 443}
    }
    assert "op-webhook.dynamo.svc" in chart.webhook_hosts()
    local = parse_settings(["--all-namespaces", "--webhook-port", "9555"], environ={})
    assert local.webhook_client_config() == {"url": "https://127.0.0.1:9555/convert"}
    assert local.webhook_hosts() == ["127.0.0.1"]
    with pytest.raises(SettingsError, match="pass only one"):
        parse_settings(
            ["--all-namespaces", "--webhook-service", "a/b", "--webhook-url", "https://x/c"], environ={}
        )
    with pytest.raises(SettingsError, match="NAMESPACE/NAME"):
        parse_settings(["--all-namespaces", "--webhook-service", "no-namespace"], environ={})


def test_help_lists_the_operator_process_flags_before_the_pod_defaults():
    from dynamo_operator.settings import build_parser

    text = build_parser().format_help()
    process, pods = text.index("\nthe operator process:\n"), text.index("\nwhat the pods it renders get")
    assert process < pods
    for flag in ("--kubeconfig", "--namespace", "--workers", "--webhook-port", "--log-level"):
        assert process < text.index(f"\n  {flag} ") < pods, flag
    for flag in ("--nats-url", "--worker-image", "--ucx-tls", "--pod-log-format"):
        assert text.index(f"\n  {flag} ") > pods, flag


def test_the_charts_operator_ports_are_the_contracts():
    """The chart's values say the operator's own ports again (YAML cannot import them): kept equal."""
    values = yaml.safe_load(
        (Path(__file__).resolve().parents[3] / "charts/dynamo-operator/values.yaml").read_text()
    )
    s = parse_settings(["--all-namespaces"], {})
    assert values["operator"]["healthPort"] == s.liveness_port == contract.OPERATOR_LIVENESS_PORT
    assert values["operator"]["webhook"]["port"] == s.webhook_port == contract.OPERATOR_WEBHOOK_PORT
