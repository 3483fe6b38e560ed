"""The Argo CD health check for DynamoGraphDeployment (charts/dynamo-operator/files/argocd-health.lua)
maps sample statuses to Healthy / Progressing / Degraded from the Ready condition and
observedGeneration, run in Lua 5.1 (the dialect of Argo CD's gopher-lua) through lupa; and the chart
README shows exactly that script."""

from __future__ import annotations

import textwrap

import pytest

from tests.integration.chart.helm import CHART

lua51 = pytest.importorskip("lupa.lua51", reason="lupa (PyPI) runs the Lua health check")

SCRIPT = (CHART / "files" / "argocd-health.lua").read_text()


def health(obj: dict) -> tuple[str, str]:
    runtime = lua51.LuaRuntime()
    runtime.globals().obj = runtime.table_from(obj, recursive=True)
    result = runtime.execute(SCRIPT)
    return result["status"], result["message"]


def dgd(generation: int = 2, status: dict | None = None) -> dict:
    obj = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"generation": generation},
    }
    if status is not None:
        obj["status"] = status
    return obj


def ready(status: str, reason: str, message: str) -> dict:
    return {"type": "Ready", "status": status, "reason": reason, "message": message}


def test_no_status_yet_is_progressing():
    assert health(dgd())[0] == "Progressing"


def test_ready_for_the_current_generation_is_healthy():
    obj = dgd(
        status={
            "observedGeneration": 2,
            "state": "successful",
            "conditions": [ready("True", "AllReady", "3/3")],
        }
    )
    assert health(obj) == ("Healthy", "3/3")


def test_ready_for_an_older_generation_is_still_progressing():
    obj = dgd(
        status={
            "observedGeneration": 1,
            "state": "successful",
            "conditions": [ready("True", "AllReady", "ok")],
        }
    )
    assert health(obj)[0] == "Progressing"


def test_not_ready_is_progressing_with_the_operator_message():
    cond = ready("False", "WaitingForPods", "decode: 0/1 ready")
    obj = dgd(status={"observedGeneration": 2, "state": "pending", "conditions": [cond]})
    assert health(obj) == ("Progressing", "decode: 0/1 ready")


def test_failed_state_is_degraded():
    cond = ready("False", "InvalidSpec", "spec.services.decode: set --tp to 8")
    obj = dgd(status={"observedGeneration": 2, "state": "failed", "conditions": [cond]})
    assert health(obj) == ("Degraded", "spec.services.decode: set --tp to 8")


def test_readme_shows_the_same_script():
    readme = (CHART / "README.md").read_text()
    assert textwrap.indent(SCRIPT, "    ") in readme
