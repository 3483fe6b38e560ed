"""KV events are wired wherever the graph's frontend routes on KV: every SGLang worker gets a
``--kv-events-config`` publisher of its own with its port(s) declared as ``kv-events`` container ports
(the router examples included), a manifest's own config is kept, and one that publishes nothing is a
``NoKvEvents`` warning (the ``SpecWarnings`` condition)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from dynamo_api.models import DynamoGraphDeployment
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
CONFIG = OperatorConfig(nats_url="nats://nats:4222", worker_image="img/worker:1")
ARGS = ["--model-path", "Qwen/Qwen3-0.6B", "--page-size", "16", "--tp", "1"]


def _containers(rendered) -> dict[str, dict]:
    """Main container of every Deployment, by its service label."""
    out = {}
    for o in rendered.objects:
        if o["kind"] == "Deployment":
            service = o["metadata"]["labels"]["nvidia.com/dynamo-component"]
            out[service] = o["spec"]["template"]["spec"]["containers"][0]
    return out


def _config(container: dict) -> dict | None:
    tokens = [*container.get("command", []), *container.get("args", [])]
    if "--kv-events-config" not in tokens:
        return None
    return json.loads(tokens[tokens.index("--kv-events-config") + 1])


def _kv_ports(container: dict) -> list[tuple[str, int]]:
    return [(p["name"], p["containerPort"]) for p in container["ports"] if p["name"].startswith("kv-events")]


def _render(
    worker_args: list[str], frontend: dict | None = None, command: list[str] | None = None, gpu: str = "1"
):
    body = {
        "metadata": {"name": "g", "namespace": "ns", "uid": "u"},
        "spec": {
            "services": {
                "Frontend": frontend
                or {
                    "componentType": "frontend",
                    "extraPodSpec": {"mainContainer": {"args": ["--router-mode", "kv"]}},
                },
                "decode": {
                    "componentType": "worker",
                    "resources": {"limits": {"gpu": gpu}},
                    "extraPodSpec": {
                        "mainContainer": {
                            "command": command or ["python3", "-m", "dynamo_worker.sglang"],
                            "args": worker_args,
                        }
                    },
                },
            }
        },
    }
    return render(DynamoGraphDeployment.model_validate(body), CONFIG)


@pytest.mark.parametrize("example", ["agg-router.yaml", "disagg-router.yaml"])
def test_router_examples_wire_kv_events_on_every_worker(example):
    dgd = DynamoGraphDeployment.model_validate(yaml.safe_load((EXAMPLES / example).read_text()))
    rendered = render(dgd, CONFIG)
    assert rendered.problems == ()
    workers = {n: c for n, c in _containers(rendered).items() if n != "Frontend"}
    assert workers
    for name, container in workers.items():
        assert _config(container) == {"publisher": "zmq", "endpoint": "tcp://*:5557"}, name
        assert _kv_ports(container) == [("kv-events", 5557)], name
    assert _config(_containers(rendered)["Frontend"]) is None
    assert not [n for n in rendered.notices if n.warning]


@pytest.mark.parametrize("example", ["agg.yaml", "disagg.yaml"])
def test_examples_without_kv_routing_get_no_kv_events(example):
    dgd = DynamoGraphDeployment.model_validate(yaml.safe_load((EXAMPLES / example).read_text()))
    for container in _containers(render(dgd, CONFIG)).values():
        assert _config(container) is None
        assert _kv_ports(container) == []


def test_router_mode_from_the_frontend_env_var_counts():
    frontend = {
        "componentType": "frontend",
        "envs": [{"name": "DYN_ROUTER_MODE", "value": "kv"}],
    }
    container = _containers(_render(ARGS, frontend))["decode"]
    assert _config(container) == {"publisher": "zmq", "endpoint": "tcp://*:5557"}


def test_the_manifests_own_publisher_is_kept_and_its_port_declared():
    own = '{"publisher":"zmq","endpoint":"tcp://*:6000","topic":"kv"}'
    rendered = _render([*ARGS, "--kv-events-config", own])
    container = _containers(rendered)["decode"]
    assert container["args"].count("--kv-events-config") == 1
    assert _config(container) == {"publisher": "zmq", "endpoint": "tcp://*:6000", "topic": "kv"}
    assert _kv_ports(container) == [("kv-events", 6000)]
    assert not [n for n in rendered.notices if n.warning]


def test_a_manifest_config_that_publishes_nothing_is_a_warning():
    rendered = _render([*ARGS, "--kv-events-config", '{"publisher":"null"}'])
    warnings = [n for n in rendered.notices if n.warning]
    assert [(n.reason, n.service) for n in warnings] == [("NoKvEvents", "decode")]
    assert "--router-mode kv" in warnings[0].message and '"publisher": "zmq"' in warnings[0].message


def test_data_parallel_ranks_get_one_port_each():
    args = [*ARGS, "--dp-size", "2", "--enable-dp-attention", "--tp", "2"]
    container = _containers(_render(args, gpu="2"))["decode"]
    assert _kv_ports(container) == [("kv-events", 5557), ("kv-events-dp1", 5558)]


def test_shell_form_gets_the_flag_inside_the_script():
    script = "python3 -m dynamo_worker.sglang --model-path Qwen/Qwen3-0.6B --tp 1 && echo done"
    rendered = _render([script], command=["sh", "-c"])
    args = _containers(rendered)["decode"]["args"]
    assert args[0].startswith(
        "python3 -m dynamo_worker.sglang --model-path Qwen/Qwen3-0.6B --tp 1 --kv-events-config "
    )
    assert args[0].endswith(" && echo done")
