"""runtime.children.die_with_parent: a child started behind the prefix gets the signal asked for
(SIGTERM, so a worker drains) when the process that started it is SIGKILLed, with no ``finally`` run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.procs import popen
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from dynamo_worker.runtime.children import die_with_parent
    child = '''
    import pathlib, signal, sys, time
    out = pathlib.Path(sys.argv[1])
    def ended(sig, frame):
        out.write_text(signal.Signals(sig).name)
        sys.exit(0)
    signal.signal(signal.SIGTERM, ended)
    out.write_text("ready")
    while True:
        time.sleep(1)
    '''
    proc = subprocess.Popen([*die_with_parent(), sys.executable, "-c", child, sys.argv[1]])
    print(proc.pid, flush=True)
    while True:
        time.sleep(1)
    """
)


def test_a_child_gets_sigterm_when_its_parent_is_killed(tmp_path: Path):
    said = tmp_path / "child.txt"
    parent = popen([sys.executable, "-c", PARENT, str(said)], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        wait_until(lambda: said.exists() and said.read_text() == "ready", "the child to start", timeout_s=30)
        parent.kill()
        parent.wait(10)
        wait_until(lambda: said.read_text() == "SIGTERM", "the child to get SIGTERM", timeout_s=10)
        wait_until(lambda: not _alive(child), "the child to end", timeout_s=10)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
        if child and _alive(child):  # the mechanism failed: leave no orphan behind
            os.kill(child, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive: its parent is gone, init reaps it
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
