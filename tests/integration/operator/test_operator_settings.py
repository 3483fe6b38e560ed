"""`python -m dynamo_operator` as a real process: ``--help`` explains every flag, and a missing scope exits
2 with the fix (the settings themselves are tested in tests/unit/operator/test_operator_settings.py)."""

import subprocess
import sys
from pathlib import Path

import pytest
from dynamo_operator.settings import OperatorSettings

pytestmark = pytest.mark.integration


def test_help_explains_every_flag():
    out = subprocess.run(
        [sys.executable, "-m", "dynamo_operator", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    flat = " ".join(out.split())
    for name, info in OperatorSettings.model_fields.items():
        assert f"--{name.replace('_', '-')}" in out
        assert f"DYN_OPERATOR_{name.upper()}" in flat
        assert " ".join(info.description.split()[:4]) in flat


def test_missing_scope_exits_2_with_the_fix(tmp_path: Path):
    r = subprocess.run(
        [sys.executable, "-m", "dynamo_operator"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert r.returncode == 2
    assert "--all-namespaces" in r.stderr
