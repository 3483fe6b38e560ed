"""Rendering the multimodal roles: an encode or diffusion worker (``--role encode|diffusion``) is a
worker Deployment with its GPU limit, the system port's probes and the request port, no bootstrap port
and no ``--host`` rewrite; its service plan says its role; a role that contradicts prefill/decode, or an
unknown role, is refused naming the field and the fix."""

from __future__ import annotations

from dynamo_api.models import DynamoGraphDeployment
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render

CONFIG = OperatorConfig(nats_url="nats://nats:4222", worker_image="img/worker:1", startup_timeout_s=600)


def _render(role_args: list[str], **extra) -> object:
    worker = {
        "componentType": "worker",
        "resources": {"limits": {"gpu": "2"}},
        "extraPodSpec": {
            "mainContainer": {
                "command": ["python3", "-m", "dynamo_worker.sglang"],
                "args": ["--model-path", "m", *role_args],
            }
        },
        **extra,
    }
    body = {
        "metadata": {"name": "g", "namespace": "ns", "uid": "u"},
        "spec": {"services": {"Frontend": {"componentType": "frontend"}, "Enc": worker}},
    }
    return render(DynamoGraphDeployment.model_validate(body), CONFIG)


def test_encode_and_diffusion_workers_render_with_gpu_limit_probes_and_their_role():
    for role in ("encode", "diffusion"):
        rendered = _render(["--role", role])
        assert rendered.ok, rendered.problems
        assert rendered.services["Enc"].role == role
        deployment = next(
            o for o in rendered.objects if o["kind"] == "Deployment" and "enc" in o["metadata"]["name"]
        )
        main = deployment["spec"]["template"]["spec"]["containers"][0]
        assert main["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert main["readinessProbe"]["httpGet"]["path"] == "/health"
        assert main["livenessProbe"]["httpGet"]["path"] == "/live"
        assert {p["name"] for p in main["ports"]} == {"system", "request"}
        assert main["args"][-2:] == ["--role", role] and "--host" not in main["args"]


def test_nvidia_dynamos_role_flags_give_the_same_roles():
    assert _render(["--multimodal-encode-worker"]).services["Enc"].role == "encode"
    assert _render(["--image-diffusion-worker"]).services["Enc"].role == "diffusion"


def test_a_multimodal_role_that_is_also_prefill_or_unknown_is_refused():
    rendered = _render(["--role", "encode"], subComponentType="prefill")
    assert not rendered.ok
    problem = rendered.problems[0]
    assert problem.reason == "RoleMismatch" and "drop subComponentType" in problem.message
    rendered = _render(["--role", "vision"])
    assert [p.reason for p in rendered.problems] == ["InvalidFlag"]
    assert "use language, encode or diffusion" in rendered.problems[0].message
