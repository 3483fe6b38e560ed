"""Running a ``tests/gpu/`` script on the mocker from a test: the scripts' own ``ENGINE=mocker`` mode
keeps them working between the rare runs on the lent GPU machines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.procs import popen

GPU_DIR = Path(__file__).resolve().parents[1] / "gpu"


def run_on_mocker(
    script: str, tmp_path: Path, *args: str, timeout_s: float = 240, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``tests/gpu/<script>`` with ``ENGINE=mocker``, its output and state under ``tmp_path``
    (``out/``, ``state/``, ``model/``) and ``env`` added; returns its exit code, stdout and stderr.
    A run past ``timeout_s`` is stopped (the scripts stop every process they started on SIGTERM) and
    fails the test with the end of its output."""
    full_env = {
        **os.environ,
        "ENGINE": "mocker",
        "OUT": str(tmp_path / "out"),
        "GPU_STATE": str(tmp_path / "state"),
        "MODEL_DIR": str(tmp_path / "model"),
        **env,
    }
    proc = popen(
        [sys.executable, str(GPU_DIR / script), *args],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=120)
        raise AssertionError(f"{script} took over {timeout_s:.0f} s:\n{stdout[-4000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
