"""The GPU proof of embeddings and structured output (tests/gpu/run_gpu_features.py) end to end on the
mocker: it starts NATS, the frontend and workers as processes, checks vector sizes, base64, usage and
/health for an embedding worker, and JSON that validates against a schema for a generation worker, and
prints a passing summary. The GPU and SGLang's own server are replaced by the mocker (the comparison
with SGLang is skipped), so this keeps the script working between runs on the lent GPU machines."""

from __future__ import annotations

import pytest

from tests.support.gpu_scripts import run_on_mocker

pytestmark = pytest.mark.integration


def test_gpu_features_script_passes_on_the_mocker(tmp_path):
    proc = run_on_mocker("run_gpu_features.py", tmp_path, FEATURES_DIR=str(tmp_path / "w"))
    stdout, stderr = proc.stdout, proc.stderr
    assert proc.returncode == 0, stdout[-4000:] + stderr[-2000:]
    summary = (tmp_path / "out" / "features_summary.txt").read_text()
    assert summary.splitlines()[-1] == "RESULT: PASS"
    for check in ("embed vector_size", "embed base64_equals_float", "json json_schema_validates"):
        assert check in summary
    assert stdout.rstrip().endswith("RESULT: PASS")
