"""Test hygiene: every process a test run starts dies with it, even when pytest is SIGKILLed (no
``finally``, no fixture teardown runs). A child pytest starts the control plane, nats-server, a
mocker, a frontend and the operator; it is SIGKILLed; every one of those processes must be gone
within ``HYGIENE_BOUND_S``.

``HYGIENE_BOUND_S`` 5 s: the kernel sends SIGKILL to each child the moment pytest dies
(``PR_SET_PDEATHSIG``); what remains is the kernel reaping them, milliseconds even on 2 busy cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.procs import popen
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

HYGIENE_BOUND_S = 5.0
START_S = 180.0  # the child starts a whole control plane and an operator on a loaded machine
INNER = Path(__file__).with_name("hygiene") / "inner_processes.py"
REPO = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead: it only waits for its (dead) parent's reaper
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_sigkill_of_pytest_leaves_no_process(tmp_path, fault_row, kube_cluster):
    row = fault_row(
        "test run SIGKILLed",
        "SIGKILL a pytest that runs etcd, apiserver, kwok, nats, mocker, frontend, operator: all exit",
        HYGIENE_BOUND_S,
    )
    pids_file = tmp_path / "pids.json"
    env = dict(os.environ, HYGIENE_PIDS=str(pids_file))
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--basetemp",
        str(tmp_path / "inner"),
        str(INNER),
    ]
    with open(tmp_path / "inner.log", "wb") as out:
        inner = popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    pids: dict[str, int] = {}
    try:

        def started() -> bool:
            if pids_file.exists():
                return True
            assert inner.poll() is None, (tmp_path / "inner.log").read_text()[-4000:]
            return False

        wait_until(started, "the inner run to start everything", timeout_s=START_S, interval_s=0.2)
        pids = json.loads(pids_file.read_text())
        assert all(alive(p) for p in pids.values()), pids
        inner.send_signal(signal.SIGKILL)
        inner.wait(10)
        killed = time.monotonic()
        while (left := [n for n, p in pids.items() if alive(p)]) and time.monotonic() - killed < 30:
            time.sleep(0.02)
        row.answered(time.monotonic() - killed)
        row.lost = len(left)
        assert left == [], f"still running after pytest was SIGKILLed: {left}"
        assert row.within_bound()
    finally:
        for pid in pids.values():  # never leave them behind, even when the assertion failed
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if inner.poll() is None:
            inner.kill()
