"""dynamo_worker.local.supervisor: children run in their own process groups with their logs in files and
on the console; readiness is their /health; a child dying during startup fails fast with its last lines;
stop() ends every process of every group, escalating to SIGKILL after the grace period."""

from __future__ import annotations

import io
import os
import re
import sys
import textwrap
import threading
from dataclasses import replace

import pytest
from dynamo_worker.local.plan import ProcessSpec
from dynamo_worker.local.supervisor import Console, ProcessDied, StartupTimeout, Supervisor
from dynamo_worker.runtime.nats_server import free_port

from tests.support.ports import refused_port
from tests.support.procs import group_members
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration

SERVE_HEALTH = textwrap.dedent(
    """
    import http.server, signal, subprocess, sys
    # a grandchild in the same process group that ignores SIGTERM: only SIGKILL of the group ends it
    subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('grandchild', flush=True); time.sleep(600)"])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a): pass
    print("serving", flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


def spec(name: str, code: str, *args: str, port: int = 1, kind: str = "worker") -> ProcessSpec:
    return ProcessSpec(
        name=name,
        service=name,
        kind=kind,  # type: ignore[arg-type]
        argv=(sys.executable, "-c", code, *args),
        env={"PATH": os.environ.get("PATH", "")},
        health_url=f"http://127.0.0.1:{port}/health",
        waiting_for=f"/health on :{port}",
    )


@pytest.fixture
def supervisor(tmp_path):
    out = io.StringIO()
    sup = Supervisor(tmp_path / "logs", Console(out), grace_s=1.0)
    sup.out = out  # type: ignore[attr-defined]
    yield sup
    sup.stop()


def test_ready_children_log_to_files_and_console_and_stop_kills_their_groups(supervisor):
    port = free_port()  # a pod's port: known before the child starts, as its probe needs (like a kubelet's)
    supervisor.start([spec("decode-0", SERVE_HEALTH, str(port), port=port)])
    assert supervisor.wait_ready(30, threading.Event())
    child = supervisor.children[0]
    wait_until(lambda: len(group_members(child.pid)) >= 2, "the grandchild to start", timeout_s=10)
    supervisor.stop()
    assert group_members(child.pid) == []
    assert "serving" in child.log_path.read_text()
    assert re.search(r"^decode-0 +\| serving$", supervisor.out.getvalue(), re.M)  # type: ignore[attr-defined]


def test_a_child_that_dies_during_startup_fails_fast_with_its_last_lines(supervisor):
    supervisor.start([spec("prefill-0", "import sys; print('bad flag --x'); sys.exit(3)")])
    with pytest.raises(ProcessDied) as e:
        supervisor.wait_ready(30, threading.Event())
    assert "prefill-0 exited with exit code 3" in str(e.value)
    assert "bad flag --x" in str(e.value)


def test_startup_timeout_names_what_is_pending(supervisor):
    supervisor.start([spec("decode-0", "import time; time.sleep(60)", port=refused_port())])
    with pytest.raises(StartupTimeout, match="decode-0 waits for /health on"):
        supervisor.wait_ready(0.5, threading.Event())


def test_a_stop_request_ends_the_wait(supervisor):
    supervisor.start([spec("decode-0", "import time; time.sleep(60)", port=refused_port())])
    stopping = threading.Event()
    stopping.set()
    assert supervisor.wait_ready(30, stopping) is False


def test_children_inherit_this_environment_under_the_plans_variables(supervisor, monkeypatch):
    """What the user exported (HF_TOKEN, HOME, PATH, ...) reaches the workers; the plan's values win."""
    monkeypatch.setenv("R3_EXPORTED", "from-the-shell")
    monkeypatch.setenv("DYN_NAMESPACE", "from-the-shell")
    code = "import os; print('env', os.environ.get('R3_EXPORTED'), os.environ['DYN_NAMESPACE'], flush=True)"
    child_spec = spec("decode-0", code)
    supervisor.start([replace(child_spec, env={**child_spec.env, "DYN_NAMESPACE": "from-the-plan"})])
    child = supervisor.children[0]
    child.proc.wait(30)
    assert "env from-the-shell from-the-plan" in child.tail_text()
