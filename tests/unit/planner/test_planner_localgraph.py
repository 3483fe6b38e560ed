"""The planner without Kubernetes (``--graph-file``): it reads its graph from a manifest file, either API
version, as the services and GPUs the Kubernetes client would give it; it picks its graph by name in a
file of several documents; a file it cannot use is refused naming the file and the fix; it never writes
replicas (``--graph-file`` needs ``--dry-run``), and its Events are log lines."""

from __future__ import annotations

import logging

import pytest
import yaml
from dynamo_worker.planner.localgraph import GraphFileError, LocalGraph
from dynamo_worker.planner.settings import parse_args
from dynamo_worker.planner.step import scaled_services
from dynamo_worker.runtime.settings import SettingsError

from tests.integration.operator.conftest import EXAMPLES

GRAPH = "sglang-disagg-planner"
ALPHA = EXAMPLES / "disagg-planner.yaml"
BETA = EXAMPLES / "v1beta1" / "disagg-planner.yaml"


@pytest.mark.parametrize("manifest", [ALPHA, BETA], ids=["v1alpha1", "v1beta1"])
async def test_the_example_graph_is_read_from_its_file_in_either_version(manifest):
    async with LocalGraph(str(manifest), "ns", GRAPH) as source:
        graph = await source.get_graph()
    assert graph["apiVersion"] == "nvidia.com/v1alpha1"
    assert graph["metadata"]["namespace"] == "ns"  # the manifest names none: the planner's, as applied
    services, urls = scaled_services(graph, ("prefill", "decode"))
    assert {r: (s.name, s.replicas, s.gpus) for r, s in services.items()} == {
        "prefill": ("prefill", 1, 1),
        "decode": ("decode", 1, 1),
    }
    assert urls == [f"http://{GRAPH}-frontend.ns.svc:8000/metrics"]


def _write(tmp_path, docs) -> str:
    path = tmp_path / "graphs.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


async def test_a_file_of_several_documents_gives_the_graph_of_that_name(tmp_path):
    planner = yaml.safe_load(ALPHA.read_text())
    other = yaml.safe_load(ALPHA.read_text())
    other["metadata"] = {"name": "other", "namespace": "elsewhere"}
    other["spec"]["services"]["decode"]["replicas"] = 3
    path = _write(
        tmp_path, [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}, other, planner]
    )

    graph = await LocalGraph(path, "ns", "other").get_graph()
    assert graph["metadata"] == {"name": "other", "namespace": "elsewhere"}
    assert scaled_services(graph, ("decode",))[0]["decode"].replicas == 3

    with pytest.raises(GraphFileError) as e:
        LocalGraph(path, "ns", "missing")
    assert f"holds 0 DynamoGraphDeployment named 'missing' (it holds: other, {GRAPH})" in str(e.value)
    assert "pass --graph with the name of the graph to plan" in str(e.value)


def test_a_file_the_planner_cannot_use_names_the_file_and_the_fix(tmp_path):
    with pytest.raises(GraphFileError, match=r"cannot read --graph-file /nowhere\.yaml: No such file"):
        LocalGraph("/nowhere.yaml", "ns", GRAPH)

    broken = yaml.safe_load(ALPHA.read_text())
    broken["spec"]["services"]["decode"]["replicas"] = "many"
    path = _write(tmp_path, [broken])
    with pytest.raises(GraphFileError) as e:
        LocalGraph(path, "ns", GRAPH)
    assert f"--graph-file {path} is not a valid DynamoGraphDeployment: spec.services.decode.replicas" in str(
        e.value
    )
    assert str(e.value).endswith("fix the manifest")

    (tmp_path / "bad.yaml").write_text("spec: [unclosed")
    with pytest.raises(
        GraphFileError,
        match=r"is not valid YAML \(line 1, column 16: expected ',' or '\]'.*\); fix the file$",
    ):
        LocalGraph(str(tmp_path / "bad.yaml"), "ns", GRAPH)


async def test_replicas_are_never_written_and_events_are_log_lines(caplog):
    source = LocalGraph(str(ALPHA), "ns", GRAPH)
    with pytest.raises(GraphFileError) as e:
        await source.set_replicas({"prefill": 2, "decode": 1})
    assert "cannot set replicas (prefill=2, decode=1)" in str(e.value) and "--dry-run" in str(e.value)

    with caplog.at_level(logging.INFO, logger="dynamo_worker.planner.localgraph"):
        graph = await source.get_graph()
        await source.event(graph, "Scaled", "Would scale: prefill prefill 1 -> 2")
        await source.event(graph, "MetricsUnavailable", "Could not read frontend metrics", "Warning")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "Event Normal Scaled: Would scale: prefill prefill 1 -> 2"),
        ("WARNING", "Event Warning MetricsUnavailable: Could not read frontend metrics"),
    ]


ENV = {"DYN_PARENT_DGD_K8S_NAME": GRAPH, "DYN_PARENT_DGD_K8S_NAMESPACE": "ns"}


def test_graph_file_needs_dry_run_which_a_flag_or_dynamos_no_operation_gives():
    with pytest.raises(SettingsError) as e:
        parse_args(["--graph-file", str(ALPHA)], ENV)
    assert (
        f"--graph-file {ALPHA} reads the graph from a file, where no replicas can be set: add --dry-run"
        in (str(e.value))
    )
    settings, _ = parse_args(["--graph-file", str(ALPHA), "--dry-run"], ENV)
    assert (settings.graph_file, settings.dry_run, settings.graph) == (str(ALPHA), True, GRAPH)
    settings, _ = parse_args(["--graph-file", str(ALPHA), "--config", '{"no_operation": true}'], ENV)
    assert settings.dry_run


def test_the_metrics_server_binds_where_the_pod_contract_says():
    assert parse_args([], ENV)[0].metrics_host == "0.0.0.0"
    assert parse_args([], {**ENV, "DYN_LISTEN_HOST": "127.0.0.1"})[0].metrics_host == "127.0.0.1"
