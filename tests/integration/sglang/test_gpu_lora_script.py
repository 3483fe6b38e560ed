"""The LoRA GPU proof (tests/gpu/run_lora.py) on the mocker: the model folder of real random weights
written (tiny here) and served through ``--model-dir`` with ``--load-format auto`` in place of dummy,
dynamo-run of the disaggregated LoRA example, its adapters generated in PEFT's format for that model and
loaded on the prefill and the decode worker, listed with
their model, served by name and as ``<model>:<adapter>`` with outputs of their own, and a mixed load of
four adapters and the base model with 0 errors and a clean Ctrl-C. The GPU is replaced by the mocker
(no GPU here) and SGLang's own server is skipped: this keeps the script working between the runs on
the lent GPU machines (its aggregated phase differs only in the manifest)."""

from __future__ import annotations

import json

import pytest

from tests.support.gpu_scripts import run_on_mocker

pytestmark = pytest.mark.integration


def test_disaggregated_adapter_requests_are_served_with_no_error(tmp_path):
    sizes = {"NREQ": "20", "CONC": "8", "ISL": "64", "OSL": "8", "PROBES": "2", "PROBE_OUT": "8"}
    proc = run_on_mocker("run_lora.py", tmp_path, "disagg", APPLY_S="1", **sizes)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    (row,) = json.loads((tmp_path / "out" / "lora.json").read_text())
    assert row["workers_with_lora"] == 2 and len(row["adapters"]) == 4
    assert row["checks"] == {
        "adapters_listed_with_parent": True,
        "base_model_colon_adapter_is_the_adapter": True,
        "adapters_change_the_output": True,
        "mixed_load_0_errors": True,
        "clean_exit": True,
    }
    assert row["ours_load"]["tokens"] == 20 * 8
    model = tmp_path / "state" / "lora-model"
    assert (model / "model.safetensors").is_file() and (model / "tokenizer.json").is_file()
    manifest = (tmp_path / "out" / "manifests" / "lora-disagg.yaml").read_text()
    assert "- --load-format\n" in manifest and "- dummy\n" not in manifest
    assert proc.stdout.rstrip().endswith("RESULT: PASS")
