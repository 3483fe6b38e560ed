"""Run by ``test_faults_hygiene.py`` in a child pytest that is then SIGKILLed: starts every kind of
process the suite starts (the control plane, nats-server, a mocker worker, a frontend process, the
operator), records their pids in ``$HYGIENE_PIDS`` and waits to be killed. Not collected on its own
(its name does not start with ``test_``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.faults.frontend_proc import start_frontend
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration


def test_start_everything_and_wait_to_be_killed(
    kube_cluster, nats_server, mockers, namespace, operator, tmp_path
):
    m = mockers("null")
    fe = start_frontend(tmp_path / "frontend.log", namespace, nats_server.url)
    pids = {name: p.pid for name, p in kube_cluster.procs.items()}
    pids |= {"nats-server": nats_server.proc.pid, "mocker": m.proc.pid, "frontend": fe.proc.pid}
    pids["operator"] = operator.proc.pid

    # Each child asks for its parent-death signal (setpriv) before it execs its program: a child still
    # in setpriv when this pytest is killed would never get it, so hand over the pids only once every
    # one runs its program (on a loaded machine the last one started may not have been scheduled yet).
    def in_setpriv() -> list[str]:
        return [name for name, pid in pids.items() if _comm(pid) == "setpriv"]

    wait_until(
        lambda: not in_setpriv(),
        "every child to run its own program (past setpriv)",
        timeout_s=30,
        interval_s=0.02,
        explain=lambda: f"still in setpriv: {in_setpriv()}",
    )
    out = Path(os.environ["HYGIENE_PIDS"])
    out.with_suffix(".tmp").write_text(json.dumps(pids))
    out.with_suffix(".tmp").rename(out)
    time.sleep(300)  # the outer test SIGKILLs this pytest long before


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
