"""The frontend's command line as a real process: ``--help`` explains the endpoints, a bad flag exits 2
naming it (the settings themselves are tested in tests/unit/frontend/test_frontend_settings.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_cli_help_and_bad_flag_exit_codes():
    r = subprocess.run(
        [sys.executable, "-m", "dynamo_worker.frontend", "--help"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "/v1/chat/completions" in r.stdout and "--router-mode" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "dynamo_worker.frontend", "--http-port", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--http-port" in r.stderr
