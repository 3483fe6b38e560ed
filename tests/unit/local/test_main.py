"""dynamo-run's command line refuses what cannot run before starting anything: an invalid manifest (the
operator's validation messages), too few GPUs for SGLang, a busy port; each exits 2 naming the fix."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

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
