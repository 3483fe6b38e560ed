"""The GPU proof of images in chat and image generation (tests/gpu/run_multimodal.py) end to end on the
mocker: it serves examples/multimodal-agg.yaml and examples/diffusion.yaml with dynamo-run and checks
the image chat path (encode worker, embedding and KV cache hits, several images, a broken image), that
an image chat is served or refused as the same chat without its image (response_format, a required
tool, logprobs), and generated images. The GPU and SGLang's own server are replaced by the mocker (the
comparison with SGLang is skipped), so this keeps the script working between runs on the lent GPU
machines."""

from __future__ import annotations

import pytest

from tests.support.gpu_scripts import run_on_mocker

pytestmark = pytest.mark.integration


def test_gpu_multimodal_script_passes_on_the_mocker(tmp_path):
    proc = run_on_mocker("run_multimodal.py", tmp_path, MM_DIR=str(tmp_path / "w"))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert summary.splitlines()[-1] == "RESULT: PASS"
    for check in (
        "image chat answers",
        "response_format: the image chat gets the text chat's 400",
        "tool_choice required: the image chat gets the text chat's 400",
        "an image chat with logprobs gets one per token",
        "n=2 b64_json",
    ):
        assert check in summary, summary
