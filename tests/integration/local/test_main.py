"""dynamo-run's command line refuses what cannot run before starting anything: an invalid manifest (the
operator's validation messages), SGLang that is not installed or has too few GPUs, a busy port, a
--model-dir that is not a folder; each exits 2 naming the fix."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

WORKER = """
apiVersion: nvidia.com/v1alpha1
kind: DynamoGraphDeployment
metadata: {name: g}
spec:
  services:
    Frontend: {componentType: frontend}
    decode:
      componentType: worker
      replicas: REPLICAS
      resources: {limits: {gpu: "1"}}
      extraPodSpec:
        mainContainer:
          command: [python3, -m, dynamo.sglang, --model-path, m]
"""


def dynamo_run(tmp_path: Path, manifest: str, *args: str, env: dict[str, str] | None = None):
    path = tmp_path / "graph.yaml"
    path.write_text(manifest)
    return subprocess.run(
        [sys.executable, "-m", "dynamo_worker.local", str(path), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_an_invalid_manifest_exits_2_with_the_field_and_message(tmp_path):
    done = dynamo_run(tmp_path, WORKER.replace("REPLICAS", "-1"), "--engine", "mocker")
    assert done.returncode == 2
    assert "spec.services.decode.replicas: Input should be greater than or equal to 0" in done.stdout


def test_sglang_without_enough_gpus_exits_2_saying_what_is_needed(tmp_path):
    done = dynamo_run(
        tmp_path, WORKER.replace("REPLICAS", "2"), "--engine", "sglang", env={"CUDA_VISIBLE_DEVICES": "0"}
    )
    assert done.returncode == 2
    assert "needs 2 GPUs" in done.stdout and "1 are visible (0)" in done.stdout
    assert "--engine mocker" in done.stdout


def test_a_busy_port_exits_2_naming_the_flag(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = dynamo_run(
            tmp_path, WORKER.replace("REPLICAS", "1"), "--engine", "sglang", "--port", str(port)
        )
    assert done.returncode == 2
    assert f"Port {port} on 127.0.0.1 is not free" in done.stdout and "--port" in done.stdout


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="SGLang is installed here")
def test_sglang_that_is_not_installed_exits_2_before_starting_anything(tmp_path):
    done = dynamo_run(
        tmp_path, WORKER.replace("REPLICAS", "1"), "--engine", "sglang", env={"CUDA_VISIBLE_DEVICES": "0"}
    )
    assert done.returncode == 2
    assert "--engine sglang needs SGLang" in done.stdout
    assert "pip install 'dynamo-sglang[sglang]'" in done.stdout and "--engine mocker" in done.stdout
    assert "Started" not in done.stdout  # no nats-server, no process


def test_a_model_dir_that_is_not_a_folder_exits_2_before_starting_anything(tmp_path):
    missing = tmp_path / "no-such-model"
    done = dynamo_run(
        tmp_path, WORKER.replace("REPLICAS", "1"), "--engine", "mocker", "--model-dir", str(missing)
    )
    assert done.returncode == 2
    assert f"--model-dir {missing} is not a folder" in done.stdout and "drop the flag" in done.stdout
    assert "Started" not in done.stdout
