"""dynamo-run reads NVIDIA Dynamo's v1beta1 manifests too: a v1beta1 file runs the same processes as its
v1alpha1 twin, and a v1beta1 mistake is reported at its own field path."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from dynamo_worker.local.manifest import ManifestError, load_manifest, parse_manifest
from dynamo_worker.local.plan import machine_env, plan_graph

REPO = Path(__file__).resolve().parents[3]


def processes(path: Path):
    plan = plan_graph(
        load_manifest(path),
        engine="mocker",
        nats_url="nats://127.0.0.1:4999",
        http_host="127.0.0.1",
        http_port=8000,
        mocker_model_dir="/tiny",
        sglang_model_path=None,
        gpus=(),
        free_port=itertools.count(20000).__next__,
        machine=machine_env(http_host="127.0.0.1", grace_s=5, path="/usr/bin"),
    )
    return [(p.name, p.argv, dict(p.env)) for p in plan.processes]


@pytest.mark.parametrize("name", ["agg.yaml", "disagg.yaml", "disagg-multinode.yaml"])
def test_v1beta1_manifest_runs_the_processes_of_its_v1alpha1_twin(name):
    assert processes(REPO / "examples" / "v1beta1" / name) == processes(REPO / "examples" / name)


def test_dynamo_v1beta1_example_runs_its_components():
    procs = {
        name: (argv, env)
        for name, argv, env in processes(REPO / "tests/fixtures/dynamo-sglang-deploy/v1beta1/disagg.yaml")
    }
    assert set(procs) == {"Frontend-0", "prefill-0", "decode-0"}
    decode_argv = procs["decode-0"][0]
    assert "dynamo_worker.mocker" in decode_argv  # Dynamo's `python3 -m dynamo.sglang`, on the mocker here
    assert decode_argv[decode_argv.index("--disaggregation-mode") + 1] == "decode"


def test_v1beta1_mistake_names_its_field():
    text = """
apiVersion: nvidia.com/v1beta1
kind: DynamoGraphDeployment
metadata: {name: g}
spec:
  components:
    - {name: Frontend, type: frontend, replicas: -1}
"""
    with pytest.raises(ManifestError, match=r"spec\.components\[0\]\.replicas"):
        parse_manifest(text)
