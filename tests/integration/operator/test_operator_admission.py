"""The validating webhook on the real apiserver: the operator registers a ValidatingWebhookConfiguration
for its namespace pointed at its own HTTPS /validate (URL and CA); `kubectl apply` of a graph that cannot
run is refused with the field and the fix and nothing is stored, in v1beta1 and in v1alpha1 (converted
by the conversion webhook before it is judged); a graph with a warning is stored and kubectl prints the
warning; an edit that only touches metadata is allowed. A DynamoModel that cannot load is refused the same
way, and one with a relative file:// source is stored with a warning."""

from __future__ import annotations

import base64
import copy
import json
import subprocess
from collections.abc import Callable

import pytest

from tests.integration.operator.conftest import Kubectl, OperatorProcess, example

pytestmark = pytest.mark.integration


def apply(kc: Kubectl, manifest: dict) -> subprocess.CompletedProcess:
    """kubectl apply as a user runs it: exit code, and stderr where refusals and warnings go."""
    return subprocess.run(
        [str(kc.cluster.bin_dir / "kubectl"), "apply", "-n", kc.namespace, "-f", "-"],
        input=json.dumps(manifest),
        capture_output=True,
        text=True,
        env=kc.cluster.env(),
        timeout=60,
    )


def too_wide_group() -> dict:
    """An engine of 4 GPUs (--tp 4) on a two-node group of 4 GPUs each."""
    graph = example("agg-multinode.yaml")
    flags = graph["spec"]["services"]["decode"]["extraPodSpec"]["mainContainer"]["args"]
    flags[flags.index("--tp") + 1] = "4"
    return graph


@pytest.fixture
def validating(operator_factory: Callable[..., OperatorProcess], kc: Kubectl) -> OperatorProcess:
    return operator_factory("--validating-webhook", f"dynamo-sglang-{kc.namespace}")


def test_operator_registers_its_validating_webhook(kc: Kubectl, validating: OperatorProcess):
    vwc = json.loads(
        kc.cluster.kubectl(
            "get", "validatingwebhookconfiguration", f"dynamo-sglang-{kc.namespace}", "-o", "json"
        )
    )
    (hook,) = vwc["webhooks"]
    assert hook["clientConfig"]["url"] == f"https://127.0.0.1:{validating.webhook_port}/validate"
    assert base64.b64decode(hook["clientConfig"]["caBundle"]).startswith(b"-----BEGIN CERTIFICATE-----")
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == [kc.namespace]
    assert (hook["failurePolicy"], hook["matchPolicy"]) == ("Ignore", "Equivalent")
    assert hook["rules"][0]["apiVersions"] == ["v1beta1"]


def test_a_graph_that_cannot_run_is_refused_at_apply(kc: Kubectl, validating: OperatorProcess):
    graph = too_wide_group()
    refused = apply(kc, graph)
    assert refused.returncode != 0
    assert (
        'admission webhook "validate.dynamographdeployments.nvidia.com" denied the request' in refused.stderr
    )
    assert (
        "spec.services.decode.extraPodSpec.mainContainer.args: Worker 'decode' runs an engine of 4 GPUs"
        in (refused.stderr)
    )
    assert "set --tp to 8" in refused.stderr
    assert kc.get("dgd", graph["metadata"]["name"]) is None

    # v1beta1, judged as sent: prefill and decode serving different models
    beta = example("v1beta1/disagg.yaml")
    prefill = next(c for c in beta["spec"]["components"] if c["name"] == "prefill")
    flags = prefill["podTemplate"]["spec"]["containers"][0]["args"]
    flags[flags.index("--served-model-name") + 1] = "Qwen/Qwen3-8B"
    refused = apply(kc, beta)
    assert refused.returncode != 0
    assert (
        "Prefill 'prefill' runs --served-model-name Qwen/Qwen3-8B but decode 'decode' runs" in refused.stderr
    )

    # the sidecar pattern (engine in another container): refused naming that container
    sidecar = copy.deepcopy(example("disagg.yaml"))
    sidecar["metadata"]["name"] = "sidecar"
    decode = sidecar["spec"]["services"]["decode"]
    engine = {
        "name": "sglang-engine",
        "image": "runtime:1",
        "command": ["python3", "-m", "sglang.launch_server"],
        "args": ["--grpc-mode", "--model-path", "Qwen/Qwen3-0.6B"],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    del decode["resources"]
    decode["extraPodSpec"] = {
        "containers": [engine],
        "mainContainer": {
            "command": ["dynamo-sglang-smg-sidecar"],
            "args": ["--smg-endpoint", "127.0.0.1:40002"],
        },
    }
    refused = apply(kc, sidecar)
    assert refused.returncode != 0
    assert "runs its engine in container 'sglang-engine'" in refused.stderr
    assert "has no GPU limit" not in refused.stderr


def test_warnings_are_printed_and_the_graph_stored(kc: Kubectl, validating: OperatorProcess):
    graph = example("agg.yaml")
    decode = graph["spec"]["services"]["decode"]
    decode["resources"]["limits"]["gpu"] = "2"  # an engine of one GPU on a pod of two: runs, one idles
    accepted = apply(kc, graph)
    assert accepted.returncode == 0, accepted.stderr
    assert (
        "Warning: Service 'decode' runs --tp 1 (engine needs 1 GPUs) on 1 pod(s) x 2 GPU(s)"
        in accepted.stderr
    )
    kc.wait_ready(graph["metadata"]["name"], timeout=90)

    # metadata alone never meets a verdict
    kc.run("annotate", "dgd", graph["metadata"]["name"], "example.com/owner=team-a")
    assert (
        kc.get("dgd", graph["metadata"]["name"])["metadata"]["annotations"]["example.com/owner"] == "team-a"
    )


def test_a_dynamo_model_that_cannot_load_is_refused_and_a_relative_source_warned(
    kc: Kubectl, validating: OperatorProcess
):
    def model(name: str, uri: str) -> dict:
        spec = {
            "modelName": name,
            "baseModelName": "Qwen/Qwen3-0.6B",
            "modelType": "lora",
            "source": {"uri": uri},
        }
        return {
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "DynamoModel",
            "metadata": {"name": "m"},
            "spec": spec,
        }

    refused = apply(kc, model("base:adapter", "hf://org/adapter"))
    assert refused.returncode != 0
    assert "DynamoModel m cannot run: spec.modelName: 'base:adapter' contains ':'" in refused.stderr
    assert "name the adapter without ':'" in refused.stderr and kc.get("dm", "m") is None
    warned = apply(kc, model("adapter", "file://adapters/a"))
    assert warned.returncode == 0, warned.stderr
    assert "Warning: spec.source.uri: file://adapters/a is relative to the manifest's folder" in warned.stderr
