"""``python -m dynamo_worker.sglang --role encode|diffusion``: the encode role's command line (parsed
without torch; the vision tower loads only in ``start``) and the diffusion role's refusal."""

from __future__ import annotations

from dynamo_worker.sglang import encode
from dynamo_worker.sglang.__main__ import main


def test_the_encode_role_takes_the_manifests_flags_and_ignores_sglangs_own():
    runtime, multimodal, settings, unknown = encode.parse(
        ["--role", "encode", "--model-path", "/models/vl", "--served-model-name", "vl",
         "--embedding-cache-mb", "64", "--page-size", "16", "--trust-remote-code", "--request-port", "0",
         "--namespace", "ns"]
    )  # fmt: skip
    assert multimodal.worker_role == "encode" and multimodal.embedding_cache_bytes == 64 * 1024 * 1024
    assert settings.model_path == "/models/vl" and settings.served_model_name == "vl"
    assert settings.trust_remote_code and settings.encoder_device == "cuda"
    assert runtime.namespace == "ns" and unknown == ["--page-size", "16"]
    encoder = encode.HfVisionEncoder(settings)
    assert encoder.model_name == "vl"
    _, _, bare, _ = encode.parse(["--multimodal-encode-worker", "--model-path", "/models/vl"])
    assert encode.HfVisionEncoder(bare).model_name == "/models/vl"


def test_the_encode_role_without_a_model_path_exits_2_naming_the_flag(capsys):
    assert main(["--role", "encode"]) == 2
    assert "--model-path is required" in capsys.readouterr().err


def test_the_diffusion_role_exits_2_saying_what_blocks_it(capsys):
    assert main(["--role", "diffusion", "--model-path", "x"]) == 2
    err = capsys.readouterr().err
    assert "mocker" in err and "diffusers" in err
