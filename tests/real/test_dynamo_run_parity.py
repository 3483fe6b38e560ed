"""``dynamo-run`` runs what the kubelet runs: for a graph served as real pods, each process dynamo-run would
start for the same manifest runs the command of its pod's main container (the same module and the same
flags in the same order), with the same env names and the same declared ports. What may differ is what a
cluster gives a pod and one machine does not: the values of ports, hosts and the downward API, and what
the machine adds to the environment (``machine_env``, the GPU ids).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from dynamo_api.models import DynamoGraphDeployment
from dynamo_operator.render import labels
from dynamo_worker.local.plan import machine_env, plan_graph

from tests.real import graphs
from tests.real.conftest import READY_S, REPO, Real

pytestmark = pytest.mark.timeout(600)
MACHINE = machine_env(http_host="127.0.0.1", grace_s=5, path="/venv/bin")


def _shape(words: list[str]) -> tuple[str | None, list[str]]:
    """The module a command runs (``-m``) and its flags, in order."""
    words = " ".join(words).split()  # a shell's `sh -c "python3 -m ..."` too
    module = words[words.index("-m") + 1] if "-m" in words[:-1] else None
    return module, [w for w in words if w.startswith("--")]


@pytest.mark.parametrize("example", ["agg.yaml", "disagg.yaml"])
def test_dynamo_run_plans_the_command_env_names_and_ports_the_kubelet_runs(
    real: Real, operator: dict[str, float], namespace: str, example: str
) -> None:
    g = graphs.Graph(REPO / "examples" / example, namespace)
    graphs.apply(real, g)
    graphs.wait_ready(real, g, READY_S)
    dgd = DynamoGraphDeployment.model_validate(g.dgd)
    plan = plan_graph(
        dgd, engine="sglang", nats_url="nats://127.0.0.1:4222", http_host="127.0.0.1", http_port=8000,
        mocker_model_dir=None, sglang_model_path=None, gpus=tuple(str(i) for i in range(8)),
        free_port=itertools.count(30000).__next__, machine=MACHINE,
    )  # fmt: skip
    checked = 0
    for proc in plan.processes:
        pods = real.pods(namespace, f"{labels.COMPONENT}={proc.service}")
        assert pods, f"no pod of {proc.service} runs"
        main: dict[str, Any] = next(c for c in pods[0]["spec"]["containers"] if c["name"] == "main")
        pod_words = [*main.get("command", []), *main.get("args", [])]
        assert _shape(list(proc.argv)) == _shape(pod_words), proc.service
        env_names = {e["name"] for e in main.get("env", [])}
        assert set(proc.env) - set(MACHINE) - {"CUDA_VISIBLE_DEVICES"} == env_names, proc.service
        assert set(proc.ports) == {p["containerPort"] for p in main.get("ports", [])}, proc.service
        checked += 1
    assert checked == len(plan.processes) >= 2
